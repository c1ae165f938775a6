"""API keys on the gRPC services (--api-keys): metadata `authorization: Bearer KEY` with the
scope each method needs; TF Serving's and V2's health and liveness methods stay open for probes.
Refusals are UNAUTHENTICATED or PERMISSION_DENIED, with one audit line; a key limited to some
models is checked against the model the request names."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from tfservo.auth.keys import ApiKey, KeyRing, NotAllowed, Unauthenticated, bearer
from tfservo.core.errors import ServingError

__all__ = ["METHOD_SCOPES", "KeyInterceptor"]

audit = logging.getLogger("tfservo.audit")

# The scope each method needs, by its full name; methods not listed need "read", health is open.
METHOD_SCOPES: dict[str, str | None] = {
    "/tensorflow.serving.PredictionService/Predict": "invoke",
    "/tensorflow.serving.PredictionService/Classify": "invoke",
    "/tensorflow.serving.PredictionService/Regress": "invoke",
    "/tensorflow.serving.PredictionService/MultiInference": "invoke",
    "/tensorflow.serving.ModelService/HandleReloadConfigRequest": "manage",
    "/inference.GRPCInferenceService/ModelInfer": "invoke",
    "/inference.GRPCInferenceService/RepositoryModelLoad": "manage",
    "/inference.GRPCInferenceService/RepositoryModelUnload": "manage",
    "/inference.GRPCInferenceService/ServerLive": None,
    "/inference.GRPCInferenceService/ServerReady": None,
    "/grpc.health.v1.Health/Check": None,
    "/grpc.health.v1.Health/Watch": None,
}


class KeyInterceptor(grpc.ServerInterceptor):
    """Checks each call's key before its method runs."""

    def __init__(self, ring: KeyRing, on_refused: Callable[[str], None] = lambda reason: None) -> None:
        self.ring = ring
        self.on_refused = on_refused

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        method = details.method
        needed = METHOD_SCOPES.get(method, "read")
        handler = continuation(details)
        if needed is None or handler is None or handler.unary_unary is None:
            return handler
        presented = next((value for key, value in details.invocation_metadata or () if key == "authorization"), None)
        try:
            key = self.ring.authenticate(bearer(presented if isinstance(presented, str) else None))
        except Unauthenticated as exc:
            return self._refusal(exc, method, needed, "-")
        try:
            self.ring.authorize(key, needed, None)
        except NotAllowed as exc:
            return self._refusal(exc, method, needed, key.name)
        if key.models is None or needed != "invoke":
            return handler
        return self._model_checked(handler, key, method)

    def _model_checked(self, handler: Any, key: ApiKey, method: str) -> Any:
        """`handler`, refusing requests for a model the key may not call."""
        inner = handler.unary_unary

        def behavior(request: Any, context: grpc.ServicerContext) -> Any:
            spec = getattr(request, "model_spec", None)
            model = getattr(spec, "name", None) or getattr(request, "model_name", None)
            try:
                self.ring.authorize(key, "invoke", model or None)
            except NotAllowed as exc:
                self._audit(exc, method, "invoke", key.name, context.peer())
                context.abort(grpc.StatusCode.PERMISSION_DENIED, exc.message)
            return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            behavior, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )

    def _refusal(self, exc: ServingError, method: str, needed: str, key: str) -> Any:
        code = grpc.StatusCode.UNAUTHENTICATED if isinstance(exc, Unauthenticated) else grpc.StatusCode.PERMISSION_DENIED

        def refuse(request: Any, context: grpc.ServicerContext) -> Any:
            self._audit(exc, method, needed, key, context.peer())
            context.abort(code, exc.message)

        return grpc.unary_unary_rpc_method_handler(refuse)

    def _audit(self, exc: ServingError, method: str, needed: str, key: str, peer: str) -> None:
        reason = "unauthenticated" if isinstance(exc, Unauthenticated) else "forbidden"
        audit.warning("refused %s peer=%s key=%s grpc %s scope=%s: %s", reason, peer, key, method, needed, exc.message)
        self.on_refused(reason)
