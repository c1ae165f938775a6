"""Start the HTTP server: in the foreground for `tfservo serve`, or on loopback in a thread
so that in-process callers (`tfservo invoke`, transform, Beam) give handlers a live rest_uri.
"""

from __future__ import annotations

import logging
import socket
import threading

import uvicorn

from tfservo.sagemaker.service import ModelService, ServiceOptions, check_labels, parse_version_labels
from tfservo.server.app import build_app
from tfservo.server.settings import ServerSettings

log = logging.getLogger("tfservo.server")


def build_service(settings: ServerSettings) -> ModelService:
    """Open every bundle in settings.paths and load its models."""
    labels = parse_version_labels(settings.version_labels)
    service = ModelService(
        ServiceOptions(
            intra_op_threads=settings.intra_op_threads,
            inter_op_threads=settings.inter_op_threads,
            version_labels=labels,
            default_model_name=settings.default_model_name,
        )
    )
    for path in settings.paths:
        service.add_bundle(path)
    check_labels(service, labels)
    return service


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0 picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _uvicorn_config(app, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning" if log_level.lower() != "debug" else "debug",
        timeout_graceful_shutdown=30,
    )


def serve(settings: ServerSettings) -> None:
    """Load the bundle(s) and serve until SIGINT/SIGTERM (in-flight requests finish first)."""
    service = build_service(settings)
    sock = bind_socket(settings.host, settings.port)
    port = sock.getsockname()[1]
    local_host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    service.rest_base = f"http://{local_host}:{port}"
    app = build_app(
        service,
        max_request_bytes=settings.max_request_bytes,
        execution_parameters=settings.execution_parameters,
    )
    server = uvicorn.Server(_uvicorn_config(app, settings.log_level))
    log.info(
        "serving %s on http://%s:%d (models: %s; default: %s)",
        ", ".join(settings.paths),
        settings.host,
        port,
        ", ".join(service.manager.model_names()) or "none",
        service.default_model(),
    )
    try:
        server.run(sockets=[sock])
    finally:
        service.close()
        log.info("stopped")


class LoopbackServer:
    """The service's REST API on 127.0.0.1 in a background thread, for in-process callers."""

    def __init__(self, service: ModelService) -> None:
        self.service = service
        self._sock = bind_socket("127.0.0.1", 0)
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(_uvicorn_config(build_app(service), "warning"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True, name="tfservo-loopback"
        )

    def start(self) -> "LoopbackServer":
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            threading.Event().wait(0.01)
        self.service.rest_base = self.base_url
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
