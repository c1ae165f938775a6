"""API keys at the HTTP edge (--api-keys): every request but health probes and the runtime API
(which SigV4 guards) must bring `Authorization: Bearer KEY` with the scope its route needs
(routes.RouteScopes) and, for a key limited to some models, name one of them. Refusals are
401 (with WWW-Authenticate) or 403, as {"error": ...} — TF Serving's, SageMaker's and V2's
error shape alike. The decision and its audit line are auth.access's, the same for gRPC; the key
never appears in either.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from tfservo.auth.access import Access, Throttled
from tfservo.auth.audit import caller
from tfservo.auth.keys import NotAllowed, Unauthenticated, bearer
from tfservo.codecs.media_types import JSON
from tfservo.core.status import error_body, error_status
from tfservo.http.hot_routes import invoked_model, request_header, retry_after_header, send_response
from tfservo.http.request_context import context_of, peer_of
from tfservo.http.routes import RouteScopes

__all__ = ["KeyCheck"]


class KeyCheck:
    """ASGI middleware: the key check before anything else answers (outside /metrics too)."""

    def __init__(self, app: ASGIApp, access: Access, scopes: RouteScopes, default_model: Callable[[], str | None]) -> None:
        self.app = app
        self.access = access
        self.scopes = scopes
        self.default_model = default_model

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        needed, params = self.scopes.match(scope["method"], scope["path"])
        if needed is None:
            await self.app(scope, receive, send)
            return
        peer = peer_of(scope)
        model = params.get("name")
        try:
            key = self.access.check_key(
                peer, bearer(request_header(scope, b"authorization")), needed, f"{scope['method']} {scope['path']}",
                # the model matters only to a key limited to some (an /invocations body names none: its header may)
                lambda: model if model is not None or needed != "invoke" else invoked_model(scope, self.default_model),
            )
        except (Throttled, Unauthenticated, NotAllowed) as exc:  # 429, 401, 403
            if isinstance(exc, Throttled):
                extra: tuple[tuple[bytes, bytes], ...] = (retry_after_header(exc.retry_after),)
            else:
                extra = ((b"www-authenticate", b'Bearer realm="tfservo"'),) if isinstance(exc, Unauthenticated) else ()
            await send_response(send, error_status(exc), error_body(exc.message), JSON, extra)
            return
        context_of(scope).caller = key  # what a Target-Model load asks (Access.check_load)
        who = caller.set(key.name)  # the management endpoints' audit lines name it
        try:
            await self.app(scope, receive, send)
        finally:
            caller.reset(who)
