"""Start `tfservo serve` in the foreground: one or several worker processes on one port,
each serving HTTP and gRPC for a service built by the one factory."""

from __future__ import annotations

import gc
import logging
import os
import re
import socket
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.types import ASGIApp

from tfservo.auth.doors import log_access
from tfservo.core.errors import ServingError
from tfservo.core.memory import resident_bytes
from tfservo.core.settings import Settings
from tfservo.server.listener import bind_socket, bind_sockets, grpc_port_settings
from tfservo.server.recycling import REASONS, WorkerWatch, hard_limit, worker_memory_limit
from tfservo.server.registry import register_server, unregister
from tfservo.server.shutdown import Drain, GracefulServer
from tfservo.server.signals import route_signals
from tfservo.server.workers import PIDS, Supervisor, WorkerLink
from tfservo.service.metrics import Metrics

if TYPE_CHECKING:
    from tfservo.http.app import ServingApp
    from tfservo.service.factory import ModelService
    from tfservo.service.runtime import Runtime

__all__ = ["READY_LINE", "serve", "serve_process", "start_worker", "uvicorn_config"]

# The server's "serving … on SCHEME://HOST:PORT …" line (`serving_line`, INFO; a supervisor's once all
# its workers serve), which says it is ready and where: what a process that started `tfservo serve --port 0` reads.
READY_LINE = re.compile(r"serving .* on (?P<url>(?P<scheme>https?)://(?P<host>[^:\s]+):(?P<port>\d+))")

# The service, app and gRPC modules import TensorFlow (TF Serving's protos do); they are
# imported where a process serves, so that the supervisor of --workers N never loads it.

log = logging.getLogger("tfservo.server")

_GRACE_SECONDS = 30.0  # how long a stop waits for requests in flight


def start_worker(
    settings: Settings, port: int, metrics: Metrics | None = None, drain: Drain | None = None,
    shared_dir: str | None = None,
) -> tuple[Runtime, ASGIApp, ServingApp]:
    """Everything one serving process needs: its runtime (built once, every door's), its ASGI app
    (with /metrics and the key check) and the serving app inside it (its call placements)."""
    from tfservo.http.app import build_app
    from tfservo.http.metrics_edge import instrument
    from tfservo.http.response_encoding import ResponseEncoding
    from tfservo.service.runtime import build_runtime

    runtime = build_runtime(settings, port, metrics=metrics, shared_dir=shared_dir)
    service, metrics = runtime.service, runtime.metrics
    # TensorFlow leaves ~270k objects on the heap; a full GC pass over them held the GIL for
    # 100-300 ms, a p99 stall for every request in flight. Frozen objects are never scanned.
    gc.freeze()
    from tfservo.server.loopback import start_handler_endpoints

    # a pipeline's other containers, an endpoint's other variants: their handlers' own REST and gRPC
    members_endpoints = start_handler_endpoints(service, members_only=True)
    if settings.api_keys and service.bundle_invoker.has_handlers():
        from tfservo.server.loopback import LoopbackServer

        # Handlers call context.rest_uri / grpc_uri / channel without a key, as in the container:
        # they get a server of their own, locked to them (this worker's, not the keyed port),
        # for the process's life.
        handler_endpoints: LoopbackServer | None = LoopbackServer(service, locked=True).start()
    else:
        handler_endpoints = None
    asynchronous = None
    if settings.async_inference_config:
        from tfservo.async_inference.endpoint import AsyncEndpoint

        asynchronous = AsyncEndpoint(service, settings, on_event=metrics.async_event,
                                     on_backlog=metrics.async_backlog_counts).start()
    app = build_app(runtime, async_intake=asynchronous.intake if asynchronous is not None else None)
    if asynchronous is not None:
        app.closers.append(asynchronous.close)
    app.closers.append(runtime.close)
    if handler_endpoints is not None:
        app.closers.insert(0, handler_endpoints.stop)
    if members_endpoints is not None:
        app.closers.insert(0, members_endpoints.stop)
    routes = app.routes
    app.hot.calls.on_queue = app.hot.invocations.on_queue = metrics.pool_queue
    outer: ASGIApp = drain.asgi(app) if drain is not None else app
    served: ASGIApp = ResponseEncoding(instrument(outer, metrics, service, routes))  # /metrics' answers too
    if runtime.access.ring is not None:
        from tfservo.http.auth_edge import KeyCheck
        from tfservo.http.routes import RouteScopes

        served = KeyCheck(served, runtime.access, RouteScopes(multi_model=settings.multi_model), service.default_model)
    return runtime, served, app


def uvicorn_config(app: Any, settings: Settings, log_level: str | None = None, **kw: Any) -> uvicorn.Config:
    """uvicorn's settings for a tfservo app: uvloop, httptools through ServingProtocol (JSON
    errors, header timeout, connection cap), no WebSockets, no access log of its own.

    `log_config=None`: uvicorn's default dictConfig() would close every logging handler in
    the process (a notebook's, a Beam worker's, a test runner's), not only its own; its
    loggers propagate to ours instead."""
    from tfservo.http.protocol import default_max_connections, protocol_class

    level = (log_level or settings.log_level).lower()
    return uvicorn.Config(
        app,
        loop="uvloop",
        http=protocol_class(
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            min_body_rate=settings.min_body_rate,
            max_connections=settings.max_connections or default_max_connections(),
            idle_poll=settings.idle_poll_us / 1e6,
            max_line=settings.max_header_line_bytes,
            max_head=settings.max_header_bytes,
        ),
        ws="none",
        lifespan="off",
        access_log=False,
        log_config=None,
        log_level="warning" if level != "debug" else "debug",
        timeout_keep_alive=max(1, round(settings.keep_alive_timeout)),
        timeout_graceful_shutdown=30,
        **_tls_options(settings),
        **kw,
    )


def _tls_options(settings: Settings) -> dict[str, Any]:
    """HTTPS on the HTTP port (--tls-cert/--tls-key; --tls-ca: clients need a certificate it signed)."""
    if not settings.tls_cert:
        return {}
    import ssl

    options: dict[str, Any] = {"ssl_certfile": settings.tls_cert, "ssl_keyfile": settings.tls_key}
    if settings.tls_ca:
        options |= {"ssl_ca_certs": settings.tls_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return options


def serve(settings: Settings) -> None:
    """Load the bundle(s) and serve until SIGINT/SIGTERM (in-flight requests finish first): under
    a supervisor that replaces workers that die or must be recycled, unless --no-supervisor."""
    if settings.no_supervisor:  # resolve_settings refused the flags that need a supervisor
        serve_process(grpc_port_settings(settings), bind_socket(settings.host, settings.port))
        return
    socks = bind_sockets(settings.host, settings.port, settings.workers)
    Supervisor(serve_process, settings, socks).run()  # each worker runs serve_process on one of them


def serve_process(settings: Settings, sock: socket.socket, link: WorkerLink | None = None) -> None:
    """One serving process on `sock` until SIGINT/SIGTERM; with `link`, one of several workers."""
    route_signals()  # before TensorFlow starts its threads (signals.py says why)
    from tfservo.grpc.endpoint import start_grpc
    from tfservo.models.savedmodel import model_calls

    port = sock.getsockname()[1]
    metrics, drain = Metrics(), Drain()
    runtime, app, serving_app = start_worker(settings, port, metrics, drain, link.shared_dir if link is not None else None)
    service = runtime.service
    memory_limit = worker_memory_limit(settings) if link is not None else 0
    if memory_limit and (rss := resident_bytes()) > memory_limit:
        service.close()
        raise ServingError(
            f"a worker holds {rss / 2**20:.0f} MB once its models are loaded, more than its memory limit of "
            f"{memory_limit / 2**20:.0f} MB; raise --max-worker-memory-mb (TFSERVO_MAX_WORKER_MEMORY_MB)"
        )
    grpc_server = start_grpc(runtime, reuse_port=link is not None, draining=lambda: drain.draining,
                             log_level=logging.DEBUG)  # the serving line says where
    config_poll = None
    if settings.model_config_file and settings.model_config_poll_seconds > 0:
        from tfservo.models.config_reloader import ConfigFilePoller

        config_poll = ConfigFilePoller(service, settings.model_config_file, settings.model_config_poll_seconds).start()
    reloader = None
    if settings.reload_code:
        from tfservo.server.reload import CodeReloader

        reloader = CodeReloader(service).start()

    def stop_listeners() -> None:
        if link is not None:  # a handler in another worker may still call back into this one
            link.wait_for_peers(_GRACE_SECONDS)
        if grpc_server is not None:
            grpc_server.stop(_GRACE_SECONDS)

    registered: list[str | None] = []  # a lone process's entry for `tfservo invoke`

    def started() -> None:
        grpc = None
        if grpc_server is not None:
            grpc = f"{' (TLS)' if settings.ssl_config_file else ''} on {settings.grpc_host or settings.host}:{grpc_server.port}"
            if settings.grpc_socket_path:
                grpc += f" and unix:{settings.grpc_socket_path}"
        if link is None:
            log_access(settings)
            log.info("%s", serving_line(settings, port, service, grpc, f"pid {os.getpid()}"))
            registered.append(register_server(settings, port))
        else:  # the supervisor says it once for all its workers, with their pids
            link.ready(serving_line(settings, port, service, grpc, PIDS))

    server = GracefulServer(
        uvicorn_config(app, settings),
        drain,
        on_stop=stop_listeners,
        grace_seconds=_GRACE_SECONDS,
        on_started=started,
        tls_handshake_timeout=settings.header_timeout,
    )
    if link is not None:
        server.alone_stops = lambda: link.recycled
        server.stop_log_level = logging.DEBUG
        link.on_retire = server.retire
        metrics.count_replacements(lambda: link.replacements, REASONS)
        metrics.worker_memory_limit.set(memory_limit)
        watch = WorkerWatch(
            (serving_app.hot.calls.running, serving_app.hot.invocations.running, model_calls)
            + ((grpc_server.placement.running,) if grpc_server is not None else ()),
            stuck_limit=hard_limit(settings),
            memory_limit=memory_limit,
            max_requests=settings.max_requests,
            replace=link.recycle,
            stop_accepting=server.stop_accepting,
            on_memory=metrics.worker_memory.set,
        ).start()
        metrics.on_answered = watch.answered
        drain.on_answer = watch.answering
    try:
        server.run(sockets=[sock])
    finally:
        for entry in registered:
            if entry:
                unregister(entry)
        if reloader is not None:
            reloader.stop()
        if config_poll is not None:
            config_poll.stop()
        if grpc_server is not None:
            grpc_server.stop(_GRACE_SECONDS).wait(_GRACE_SECONDS + 5)
        serving_app.close()  # its pools, and the capture writer's last lines
        metrics.close()  # its last counts
        service.close()
        log.log(logging.INFO if link is None else logging.DEBUG, "stopped")  # a supervisor says it once


def serving_line(settings: Settings, port: int, service: ModelService, grpc: str | None, pids: str) -> str:
    """The line that says a server is serving, and where (READY_LINE reads its URL; `grpc`: " on
    HOST:PORT", TLS said before it): logged by a process serving alone, and once for all its
    workers by a supervisor (`pids`: PIDS then)."""
    where = (f"the variants of {settings.variants_file}" if settings.variants_file else
             f"the pipeline {' → '.join(settings.paths)}" if settings.pipeline and len(settings.paths) > 1 else
             None) or ", ".join(settings.paths) or (
        f"multi-model root {settings.model_root}" if settings.multi_model
        else settings.model_config_file or settings.model_base_path)
    return (
        f"serving {where} on {'https' if settings.tls_cert else 'http'}://{settings.host}:{port}"
        f"{f' and gRPC{grpc}' if grpc else ''} (models: {', '.join(service.manager.model_names()) or 'none'}; "
        f"default: {service.default_model()}; {pids} of {settings.workers} workers, "
        f"{settings.intra_op_threads} TF thread(s) each; "
        f"batching: {settings.batching.mode if settings.batching else 'off'}; "
        f"memory {resident_bytes() / 2**20:.0f} MB)"
    )


