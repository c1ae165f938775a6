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

from tfservo.auth.keys import KeyRing, NotAllowed, Unauthenticated, bearer
from tfservo.core.custom_attributes import parse_custom_attributes
from tfservo.core.errors import ServingError
from tfservo.http.routes import RouteScopes

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
        authorization = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
        model = params.get("name") or (self._invoked_model(scope) if needed == "invoke" else None)
        peer = (scope.get("client") or ("-", 0))[0]
        wait = self.ring.throttle.held(peer)
        if wait:
            await self._slow_down(scope, send, peer, wait)
            return
        try:
            key = self.ring.authenticate(bearer(authorization))
        except Unauthenticated as exc:
            self.ring.throttle.failed(peer)
            await self._refuse(scope, send, exc, "-", needed, model)
            return
        self.ring.throttle.succeeded(peer)
        try:
            self.ring.authorize(key, needed, model)
        except NotAllowed as exc:
            await self._refuse(scope, send, exc, key.name, needed, model)
            return
        if needed == "manage":
            client = scope.get("client") or ("-", 0)
            audit.info("manage peer=%s key=%s %s %s model=%s", client[0], key.name, scope["method"], scope["path"],
                       model or "-")
        await self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, send: Send, exc: ServingError, key: str, needed: str, model: str | None) -> None:
        """401 (no valid key, with WWW-Authenticate) or 403 (not this scope or model), one audit line."""
        unauthenticated = isinstance(exc, Unauthenticated)
        reason = "unauthenticated" if unauthenticated else "forbidden"
        client = scope.get("client") or ("-", 0)
        audit.warning("refused %s peer=%s key=%s %s %s scope=%s model=%s: %s", reason, client[0], key,
                      scope["method"], scope["path"], needed, model or "-", exc.message)
        self.on_refused(reason)
        body = orjson.dumps({"error": exc.message})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if unauthenticated:
            headers.append((b"www-authenticate", b'Bearer realm="tfservo"'))
        await send({"type": "http.response.start", "status": 401 if unauthenticated else 403, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _slow_down(self, scope: Scope, send: Send, peer: str, wait: float) -> None:
        """429 with Retry-After for a peer that keeps failing: its key is not even looked at."""
        audit.warning("refused throttled peer=%s %s %s: %.0f s to wait", peer, scope["method"], scope["path"], wait)
        self.on_refused("throttled")
        body = orjson.dumps({"error": f"too many failed authentications from {peer}: retry in {math.ceil(wait)} s"})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"retry-after", str(math.ceil(wait)).encode())]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _invoked_model(self, scope: Scope) -> str | None:
        """The model an /invocations request names (tfs-model-name), else the default model."""
        for name, value in scope["headers"]:
            if name == b"x-amzn-sagemaker-custom-attributes":
                try:
                    named = parse_custom_attributes(value.decode("latin-1")).model_name
                except ServingError:
                    named = None  # the route answers the malformed header itself
                if named:
                    return named
        return self.default_model()
