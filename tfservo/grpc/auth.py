"""API keys on the gRPC services (--api-keys): metadata `authorization: Bearer KEY` with the
scope each method needs; TF Serving's and V2's health and liveness methods stay open for probes.
Refusals are UNAUTHENTICATED, PERMISSION_DENIED or (a throttled peer) RESOURCE_EXHAUSTED; the
decision and its audit line are auth.access's, the same as HTTP's. A key limited to some models
is checked against the model the request names."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from tfservo.auth.access import Access, Throttled
from tfservo.auth.audit import caller
from tfservo.auth.keys import NotAllowed, Unauthenticated, bearer
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

    def __init__(self, access: Access) -> None:
        self.access = access

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
                key = self.access.check_key(
                    peer_address(context.peer()), token, needed, f"grpc {method}", lambda: _model_named(request) if needed == "invoke" else None
                )
            except Throttled as exc:
                context.set_trailing_metadata((("retry-after", str(math.ceil(exc.retry_after))),))
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, exc.message)
            except Unauthenticated as exc:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
            except NotAllowed as exc:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, exc.message)
            who = caller.set(key.name)
            try:
                return await inner(request, context)
            finally:
                caller.reset(who)

        return grpc.unary_unary_rpc_method_handler(
            behavior, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


def _model_named(request: object) -> str | None:
    """The model a request names (TF Serving's model_spec, V2's model_name)."""
    spec = getattr(request, "model_spec", None)
    return getattr(spec, "name", None) or getattr(request, "model_name", None) or None
