"""Start TF Serving's gRPC API next to the HTTP server, for one serving process."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import grpc

from tfservo.core.settings import Settings
from tfservo.core.tfs_configs import read_ssl_config
from tfservo.grpc.auth import KeyInterceptor
from tfservo.grpc.options import server_options
from tfservo.grpc.server import GrpcServer
from tfservo.service.runtime import Runtime

__all__ = ["start_grpc"]

log = logging.getLogger("tfservo.server")


def start_grpc(
    runtime: Runtime,
    *,
    settings: Settings | None = None,
    reuse_port: bool = False,
    log_level: int = logging.INFO,
    draining: Callable[[], bool] = lambda: False,
    socket_only: bool = False,
) -> GrpcServer | None:
    """Serve gRPC on the settings' grpc_port (0 picks a free port; None: no gRPC) with the
    runtime's V2 data plane, gate, access check and capture taps, and tell handlers where;
    `settings`: in place of the service's (a loopback server's own address).

    `log_level` is the level of the "gRPC on HOST:PORT" line (a loopback server's is DEBUG);
    `socket_only`: on the settings' grpc_socket_path and no port (a locked loopback server)."""
    service, metrics = runtime.service, runtime.metrics
    settings = settings or runtime.settings
    if settings.grpc_port is None and not socket_only:
        return None
    host = settings.grpc_host or settings.host
    server = GrpcServer(
        service.api,
        host=host,
        port=None if socket_only else settings.grpc_port,
        max_message_bytes=settings.max_request_bytes,
        batched=service.batches,
        max_queued=settings.max_queued_per_model,
        scope=metrics.scope,
        reload_config=lambda: functools.partial(service.model_config.reload_config,
                                                arrived="the management API (HandleReloadConfigRequest)"),
        reuse_port=reuse_port,
        credentials=server_credentials(settings.ssl_config_file) if settings.ssl_config_file else None,
        draining=draining,
        socket_path=settings.grpc_socket_path,
        options=server_options(settings),
        interceptors=[KeyInterceptor(runtime.access)] if runtime.access.ring is not None else [],
        gate=runtime.gate,
        taps=runtime.taps,
        placement=runtime.placements.grpc,
    )
    from tfservo.grpc.v2 import v2_handler

    server.placement.on_queue = metrics.pool_queue
    server.add_service(v2_handler(runtime.v2, server.placement, server.queue, metrics.v2_scope, runtime.gate, runtime.taps))
    if settings.profiler:
        from tfservo.grpc.profiler import profiler_handler

        server.add_service(profiler_handler())
    server.start()
    if service.grpc_port is None and service.grpc_socket is None:  # else handlers have a loopback server's
        service.grpc_port = server.port
    log.log(log_level, "gRPC%s on %s:%d%s", " (TLS)" if settings.ssl_config_file else "", host, server.port,
            f" and unix:{settings.grpc_socket_path}" if settings.grpc_socket_path else "")
    return server


def server_credentials(path: str) -> grpc.ServerCredentials:
    """TF Serving's --ssl_config_file (text SSLConfig: server_key, server_cert, custom_ca,
    client_verify; PEM text in the file) as gRPC server credentials."""
    config = read_ssl_config(path)
    return grpc.ssl_server_credentials(
        [(config.server_key.encode(), config.server_cert.encode())],
        root_certificates=config.custom_ca.encode() if config.custom_ca else None,
        require_client_auth=config.client_verify,
    )
