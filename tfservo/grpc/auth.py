"""API keys on the gRPC services (--api-keys): metadata `authorization: Bearer KEY` with the
scope each method needs; TF Serving's and V2's health and liveness methods stay open for probes.
Refusals are UNAUTHENTICATED or PERMISSION_DENIED, with one audit line; a key limited to some
models is checked against the model the request names."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from tfservo.auth.audit import caller
from tfservo.auth.keys import KeyRing, NotAllowed, Unauthenticated, bearer
from tfservo.core.errors import ServingError
from tfservo.grpc.health import HEALTH_METHODS
from tfservo.grpc.methods import method_scopes, peer_address
from tfservo.grpc.tfserving import MODEL_METHODS, MODEL_SERVICE, PREDICTION_METHODS, PREDICTION_SERVICE
from tfservo.grpc.v2 import V2_METHODS
from tfservo.grpc.v2_protocol import SERVICE as V2_SERVICE

__all__ = ["METHOD_SCOPES", "KeyInterceptor"]

audit = logging.getLogger("tfservo.audit")

# The scope each method needs, by its full name, from the services' declarations; methods not
# listed (the profiler's) need "read".
METHOD_SCOPES: dict[str, str | None] = {
    **method_scopes(PREDICTION_SERVICE, PREDICTION_METHODS),
    **method_scopes(MODEL_SERVICE, MODEL_METHODS),
    **method_scopes(V2_SERVICE, V2_METHODS),
    **{f"/grpc.health.v1.Health/{name}": None for name in HEALTH_METHODS},
}


class _Refused(Exception):
    """A call the key check turns away: its status and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(code, message)
        self.code, self.message = code, message


class KeyInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc, unused-ignore]  # grpcio is untyped
    """Checks each call's key, in the call itself (where its peer is known), before its method runs."""

    def __init__(self, ring: KeyRing, on_refused: Callable[[str], None] = lambda reason: None) -> None:
        self.ring = ring
        self.on_refused = on_refused

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        method = details.method
        needed = METHOD_SCOPES.get(method, "read")
        handler = await continuation(details)
        if needed is None or handler is None or handler.unary_unary is None:
            return handler
        presented = next((value for key, value in details.invocation_metadata or () if key == "authorization"), None)
        token = bearer(presented if isinstance(presented, str) else None)
        inner = handler.unary_unary

        async def behavior(request: object, context: grpc.aio.ServicerContext) -> object:
            try:
                key = self._check(token, needed, method, request, context)
            except _Refused as refused:
                await context.abort(refused.code, refused.message)
            who = caller.set(key)
            try:
                return await inner(request, context)
            finally:
                caller.reset(who)

        return grpc.unary_unary_rpc_method_handler(
            behavior, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )

    def _check(self, token: str | None, needed: str, method: str, request: object, context: grpc.aio.ServicerContext) -> str:
        """The key's name, or _Refused unless its key may (throttled peers first, then the key,
        its scope and model)."""
        peer = peer_address(context.peer())
        wait = self.ring.throttle.held(peer)
        if wait:
            audit.warning("refused throttled peer=%s grpc %s: %.0f s to wait", peer, method, wait)
            self.on_refused("throttled")
            context.set_trailing_metadata((("retry-after", str(math.ceil(wait))),))
            raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"too many failed authentications from {peer}: retry in {math.ceil(wait)} s")
        try:
            key = self.ring.authenticate(token)
        except Unauthenticated as exc:
            self.ring.throttle.failed(peer)
            raise self._refuse(exc, grpc.StatusCode.UNAUTHENTICATED, method, needed, "-", peer) from None
        self.ring.throttle.succeeded(peer)
        spec = getattr(request, "model_spec", None)
        model = (getattr(spec, "name", None) or getattr(request, "model_name", None) or None) if needed == "invoke" else None
        try:
            self.ring.authorize(key, needed, model)
        except NotAllowed as exc:
            raise self._refuse(exc, grpc.StatusCode.PERMISSION_DENIED, method, needed, key.name, peer) from None
        return key.name

    def _refuse(self, exc: ServingError, code: grpc.StatusCode, method: str, needed: str, key: str, peer: str) -> _Refused:
        reason = "unauthenticated" if code == grpc.StatusCode.UNAUTHENTICATED else "forbidden"
        audit.warning("refused %s peer=%s key=%s grpc %s scope=%s: %s", reason, peer, key, method, needed, exc.message)
        self.on_refused(reason)
        return _Refused(code, exc.message)
