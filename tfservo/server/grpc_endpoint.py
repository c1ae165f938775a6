"""Start TF Serving's gRPC API next to the HTTP server, for one serving process."""

from __future__ import annotations

import logging

from tfservo.config import Settings
from tfservo.sagemaker.service import ModelService
from tfservo.server.metrics import Metrics
from tfservo.tfserving.grpc_service import GrpcServer
from tfservo.tfserving.request_labels import plain_scope

__all__ = ["start_grpc"]

log = logging.getLogger("tfservo.server")


def start_grpc(
    service: ModelService,
    settings: Settings,
    metrics: Metrics | None = None,
    *,
    reuse_port: bool = False,
    log_level: int = logging.INFO,
) -> GrpcServer | None:
    """Serve gRPC on settings.grpc_port (0 picks a free port; None: no gRPC) and tell handlers where.

    `log_level` is the level of the "gRPC on HOST:PORT" line (a loopback server's is DEBUG)."""
    if settings.grpc_port is None:
        return None
    server = GrpcServer(
        service.api,
        host=settings.host,
        port=settings.grpc_port,
        max_message_bytes=settings.max_request_bytes,
        scope=metrics.scope if metrics is not None else plain_scope,
        reload_config=lambda: service.model_config.reload_config,
        reuse_port=reuse_port,
    ).start()
    service.grpc_port = server.port
    log.log(log_level, "gRPC on %s:%d", settings.host, server.port)
    return server
