"""Start TF Serving's gRPC API next to the HTTP server, for one serving process."""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from tfservo.auth.audit import ManagementGate
from tfservo.core.request_labels import plain_scope
from tfservo.core.settings import Settings
from tfservo.core.tfs_configs import read_ssl_config
from tfservo.grpc.options import server_options
from tfservo.grpc.server import GrpcServer
from tfservo.service.factory import ModelService
from tfservo.service.metrics import Metrics
from tfservo.service.v2_dataplane import V2DataPlane

__all__ = ["start_grpc"]

log = logging.getLogger("tfservo.server")


def start_grpc(
    service: ModelService,
    settings: Settings,
    metrics: Metrics | None = None,
    *,
    reuse_port: bool = False,
    log_level: int = logging.INFO,
    draining: Callable[[], bool] = lambda: False,
    v2: V2DataPlane,
) -> GrpcServer | None:
    """Serve gRPC on settings.grpc_port (0 picks a free port; None: no gRPC) and tell handlers where;
    `v2` is the HTTP app's V2 data plane, so both transports answer from one.

    `log_level` is the level of the "gRPC on HOST:PORT" line (a loopback server's is DEBUG)."""
    if settings.grpc_port is None:
        return None
    host = settings.grpc_host or settings.host
    gate = ManagementGate(settings, metrics.management_action if metrics is not None else lambda door, outcome: None)
    server = GrpcServer(
        service.api,
        host=host,
        port=settings.grpc_port,
        max_message_bytes=settings.max_request_bytes,
        batched=service.batches,
        max_queued=settings.max_queued_per_model,
        scope=metrics.scope if metrics is not None else plain_scope,
        reload_config=lambda: service.model_config.reload_config,
        reuse_port=reuse_port,
        credentials=server_credentials(settings.ssl_config_file) if settings.ssl_config_file else None,
        draining=draining,
        socket_path=settings.grpc_socket_path,
        options=server_options(settings),
        interceptors=_key_check(settings, metrics),
        gate=gate,
    )
    from tfservo.grpc.v2 import v2_handler

    if metrics is not None:
        server.placement.on_queue = metrics.pool_queue
    server.add_service(v2_handler(v2, server.placement, server.queue, metrics.v2_scope if metrics is not None else plain_scope, gate))
    if settings.profiler:
        from tfservo.grpc.profiler import profiler_handler

        server.add_service(profiler_handler())
    server.start()
    if service.grpc_port is None:  # else handlers already have one of their own (a loopback server)
        service.grpc_port = server.port
    log.log(log_level, "gRPC%s on %s:%d%s", " (TLS)" if settings.ssl_config_file else "", host, server.port,
            f" and unix:{settings.grpc_socket_path}" if settings.grpc_socket_path else "")
    return server


def _key_check(settings: Settings, metrics: Metrics | None) -> list[grpc.aio.ServerInterceptor]:
    """The API-key interceptor under --api-keys, else none."""
    if not settings.api_keys:
        return []
    from tfservo.auth.keys import KeyRing
    from tfservo.grpc.auth import KeyInterceptor

    return [KeyInterceptor(KeyRing(settings.api_keys), metrics.auth_refused if metrics is not None else lambda reason: None)]


def server_credentials(path: str) -> grpc.ServerCredentials:
    """TF Serving's --ssl_config_file (text SSLConfig: server_key, server_cert, custom_ca,
    client_verify; PEM text in the file) as gRPC server credentials."""
    config = read_ssl_config(path)
    return grpc.ssl_server_credentials(
        [(config.server_key.encode(), config.server_cert.encode())],
        root_certificates=config.custom_ca.encode() if config.custom_ca else None,
        require_client_auth=config.client_verify,
    )
