"""API keys at the HTTP edge (--api-keys): every request but health probes and the runtime API
(which SigV4 guards) must bring `Authorization: Bearer KEY` with the scope its route needs
(routes.RouteScopes) and, for a key limited to some models, name one of them. Refusals are
401 (with WWW-Authenticate) or 403, as {"error": ...} — TF Serving's, SageMaker's and V2's
error shape alike — with one audit line each; the key never appears in either.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from tfservo.auth.audit import caller
from tfservo.auth.keys import KeyRing, NotAllowed, Unauthenticated, bearer
from tfservo.codecs.media_types import JSON
from tfservo.core.errors import ServingError
from tfservo.http.hot_routes import CUSTOM_ATTRIBUTES, request_header, retry_after_header, send_response
from tfservo.http.routes import RouteScopes
from tfservo.service.custom_attributes import parse_custom_attributes

__all__ = ["KeyCheck"]

audit = logging.getLogger("tfservo.audit")


class KeyCheck:
    """ASGI middleware: the key check before anything else answers (outside /metrics too)."""

    def __init__(
        self, app: ASGIApp, ring: KeyRing, scopes: RouteScopes, default_model: Callable[[], str | None],
        on_refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.app = app
        self.ring = ring
        self.scopes = scopes
        self.default_model = default_model
        self.on_refused = on_refused  # ("unauthenticated" | "forbidden" | "throttled"): the metric

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        needed, params = self.scopes.match(scope["method"], scope["path"])
        if needed is None:
            await self.app(scope, receive, send)
            return
        peer = (scope.get("client") or ("-", 0))[0]
        wait = self.ring.throttle.held(peer)
        if wait:
            audit.warning("refused throttled peer=%s %s %s: %.0f s to wait", peer, scope["method"], scope["path"], wait)
            self.on_refused("throttled")
            body = orjson.dumps({"error": f"too many failed authentications from {peer}: retry in {math.ceil(wait)} s"})
            await send_response(send, 429, body, JSON, (retry_after_header(wait),))
            return
        try:
            key = self.ring.authenticate(bearer(request_header(scope, b"authorization")))
        except Unauthenticated as exc:
            self.ring.throttle.failed(peer)
            await self._refuse(scope, send, exc, peer, "-", needed, params.get("name"))
            return
        self.ring.throttle.succeeded(peer)
        # the model matters only to a key limited to some (an /invocations body names none: its header may)
        model = params.get("name")
        if model is None and key.models is not None and needed == "invoke":
            model = self._invoked_model(scope)
        try:
            self.ring.authorize(key, needed, model)
        except NotAllowed as exc:
            await self._refuse(scope, send, exc, peer, key.name, needed, model)
            return
        who = caller.set(key.name)  # the management endpoints' audit lines name it
        try:
            await self.app(scope, receive, send)
        finally:
            caller.reset(who)

    async def _refuse(
        self, scope: Scope, send: Send, exc: ServingError, peer: str, key: str, needed: str, model: str | None,
    ) -> None:
        """401 (no valid key, with WWW-Authenticate) or 403 (not this scope or model), one audit line."""
        unauthenticated = isinstance(exc, Unauthenticated)
        reason = "unauthenticated" if unauthenticated else "forbidden"
        audit.warning("refused %s peer=%s key=%s %s %s scope=%s model=%s: %s", reason, peer, key,
                      scope["method"], scope["path"], needed, model or "-", exc.message)
        self.on_refused(reason)
        challenge = ((b"www-authenticate", b'Bearer realm="tfservo"'),) if unauthenticated else ()
        await send_response(send, 401 if unauthenticated else 403, orjson.dumps({"error": exc.message}), JSON, challenge)

    def _invoked_model(self, scope: Scope) -> str | None:
        """The model an /invocations request names (tfs-model-name), else the default model."""
        try:
            named = parse_custom_attributes(request_header(scope, CUSTOM_ATTRIBUTES)).model_name
        except ServingError:
            named = None  # the route answers the malformed header itself
        return named or self.default_model()
