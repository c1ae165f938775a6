"""Start the HTTP server: in the foreground for `tfservo serve` (one or several worker
processes on one port), or on loopback in a thread so that in-process callers
(`tfservo invoke`, transform, Beam) give handlers a live rest_uri and gRPC channel.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading

from typing import TYPE_CHECKING

import uvicorn

from tfservo.server.metrics import ASGIApp, Metrics
from tfservo.server.shutdown import Drain, GracefulServer
from tfservo.server.settings import ServerSettings
from tfservo.server.workers import Supervisor, WorkerLink

if TYPE_CHECKING:
    from tfservo.sagemaker.service import ModelService

# The service, app and gRPC modules import TensorFlow (TF Serving's protos do); they are
# imported where a process serves, so that the supervisor of --workers N never loads it.

log = logging.getLogger("tfservo.server")

_GRACE_SECONDS = 30.0  # how long a stop waits for requests in flight
_LOOPBACK_GRACE_SECONDS = 5.0  # in-process callers stop it after their own calls are done


def build_service(settings: ServerSettings, metrics: Metrics | None = None) -> ModelService:
    """Open every bundle in settings.paths and load its models (batched when configured)."""
    from tfservo.sagemaker.service import ModelService, ServiceOptions, check_labels, parse_version_labels

    labels = parse_version_labels(settings.version_labels)
    runner_factory = None
    if settings.batching is not None:
        from tfservo.batching import make_runner_factory

        runner_factory = make_runner_factory(settings.batching, on_batch=metrics.batch_hook if metrics else None)
    service = ModelService(
        ServiceOptions(
            intra_op_threads=settings.intra_op_threads,
            inter_op_threads=settings.inter_op_threads,
            version_labels=labels,
            default_model_name=settings.default_model_name,
            runner_factory=runner_factory,
            multi_model=settings.multi_model,
            on_event=metrics.model_event if metrics else None,
        )
    )
    for path in settings.paths:
        service.add_bundle(path)
    if settings.model_config_file:
        service.model_config.load_file(settings.model_config_file)
    check_labels(service, labels)
    service.lifecycle.start_polling(settings.file_system_poll_wait_seconds)
    return service


def start_worker(
    settings: ServerSettings, port: int, metrics: Metrics | None = None, drain: Drain | None = None
) -> tuple[ModelService, ASGIApp]:
    """Everything one serving process needs: the loaded service and its ASGI app (with /metrics)."""
    from tfservo.server.app import build_app

    metrics = metrics or Metrics()
    service = build_service(settings, metrics)
    # TensorFlow leaves ~270k objects on the heap; a full GC pass over them held the GIL for
    # 100-300 ms, a p99 stall for every request in flight. Frozen objects are never scanned.
    gc.freeze()
    local_host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    service.rest_base = f"http://{local_host}:{port}"
    multi_model = None
    if settings.multi_model:
        from tfservo.sagemaker.multi_model import MultiModelEndpoint

        multi_model = MultiModelEndpoint(service, settings.model_root)
    app = build_app(
        service,
        max_request_bytes=settings.max_request_bytes,
        execution_parameters=settings.execution_parameters,
        multi_model=multi_model,
    )
    routes = app.routes
    if drain is not None:
        app = drain.asgi(app)
    return service, metrics.asgi(app, service, routes)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0 picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _uvicorn_config(app, log_level: str, **kw) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning" if log_level.lower() != "debug" else "debug",
        timeout_graceful_shutdown=30,
        **kw,
    )


def serve(settings: ServerSettings) -> None:
    """Load the bundle(s) and serve until SIGINT/SIGTERM (in-flight requests finish first)."""
    sock = bind_socket(settings.host, settings.port)
    if settings.workers > 1:
        Supervisor(serve_process, settings, sock).run()  # each worker runs serve_process
        return
    serve_process(settings, sock)


def serve_process(settings: ServerSettings, sock: socket.socket, link: WorkerLink | None = None) -> None:
    """One serving process on `sock` until SIGINT/SIGTERM; with `link`, one of several workers."""
    from tfservo.server.grpc_endpoint import start_grpc

    port = sock.getsockname()[1]
    metrics, drain = Metrics(), Drain()
    service, app = start_worker(settings, port, metrics, drain)
    grpc_server = start_grpc(service, settings, metrics, reuse_port=link is not None)

    def stop_listeners() -> None:
        if link is not None:  # a handler in another worker may still call back into this one
            link.wait_for_peers(_GRACE_SECONDS)
        if grpc_server is not None:
            grpc_server.stop(_GRACE_SECONDS)

    def started() -> None:
        _log_ready(settings, port, service)
        if link is not None:
            link.ready()

    server = GracefulServer(
        _uvicorn_config(app, settings.log_level),
        drain,
        on_stop=stop_listeners,
        grace_seconds=_GRACE_SECONDS,
        on_started=started,
    )
    try:
        server.run(sockets=[sock])
    finally:
        if grpc_server is not None:
            grpc_server.stop(_GRACE_SECONDS).wait(_GRACE_SECONDS + 5)
        service.close()
        log.info("stopped")


def _log_ready(settings: ServerSettings, port: int, service: ModelService) -> None:
    log.info(
        "serving %s on http://%s:%d (models: %s; default: %s; pid %d of %d workers; batching: %s)",
        ", ".join(settings.paths)
        or (f"multi-model root {settings.model_root}" if settings.multi_model else settings.model_config_file),
        settings.host,
        port,
        ", ".join(service.manager.model_names()) or "none",
        service.default_model(),
        os.getpid(),
        settings.workers,
        "on" if settings.batching else "off",
    )


class LoopbackServer:
    """The service's REST and gRPC APIs on 127.0.0.1 (free ports) in background threads, for
    in-process callers: handlers' context.rest_uri, grpc_uri and channel reach them."""

    def __init__(self, service: ModelService) -> None:
        from tfservo.server.app import build_app

        self.service = service
        self._sock = bind_socket("127.0.0.1", 0)
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._app = build_app(service)
        self._server = uvicorn.Server(_uvicorn_config(self._app, "warning"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True, name="tfservo-loopback"
        )
        self._grpc = None
        self._previous = (service.rest_base, service.grpc_port)

    def start(self) -> "LoopbackServer":
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            threading.Event().wait(0.01)
        self.service.rest_base = self.base_url
        from tfservo.server.grpc_endpoint import start_grpc

        loopback = ServerSettings(paths=[], host="127.0.0.1", grpc_port=0)
        self._grpc = start_grpc(self.service, loopback, log_level=logging.DEBUG)
        return self

    def stop(self) -> None:
        """Stop both listeners (calls in flight finish first) and restore the service's addresses."""
        if self._grpc is not None:
            self._grpc.stop(_LOOPBACK_GRACE_SECONDS).wait(_LOOPBACK_GRACE_SECONDS + 5)
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._app.close()  # its thread pools
        self.service.rest_base, self.service.grpc_port = self._previous
