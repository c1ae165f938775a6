"""`grpc.health.v1.Health` for Kubernetes gRPC probes and grpc_health_probe: the server ("") is
SERVING while every configured model has an AVAILABLE version and the server is not draining;
a model name is SERVING while it has one. Unknown names are NOT_FOUND, as the protocol says."""

from __future__ import annotations

from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2

from tfservo.core.errors import ServingError
from tfservo.models.servables import ModelManager, State

__all__ = ["HEALTH_METHODS", "HealthService"]

HEALTH_METHODS = ("Check", "Watch")  # open to all: probes carry no key


class HealthService(health.aio.HealthServicer):  # type: ignore[misc, unused-ignore]  # grpcio is untyped
    """Health answered from the model manager at each check (Watch gets the same on each change
    the checks see)."""

    def __init__(self, manager: ModelManager, draining: Callable[[], bool] = lambda: False) -> None:
        super().__init__()
        self.manager = manager
        self.draining = draining

    def status(self, service: str) -> int | None:
        """The health of `service` ("" for the server), or None for a name that is not served."""
        names = self.manager.model_names()
        if service and service not in names:
            return None
        if self.draining():
            return int(health_pb2.HealthCheckResponse.NOT_SERVING)
        wanted = [service] if service else names
        try:
            serving = all(
                any(v.state is State.AVAILABLE for v in self.manager.model(name).versions.values()) for name in wanted
            )
        except ServingError:  # unloaded while this looked
            serving = False
        return int(health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING)

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no model named {request.service!r} is served")
        assert status is not None  # abort raised
        await self.set(request.service, status)  # Watch streams hear of it
        return health_pb2.HealthCheckResponse(status=status)
