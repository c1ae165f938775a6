"""The service's REST and gRPC APIs on 127.0.0.1 for in-process callers, so that handlers'
`context.rest_uri`, `grpc_uri` and `channel` answer in `tfservo invoke`, every transform
engine and the pipeline adapters exactly as they do under `tfservo serve`.

`start_handler_endpoints` is the one place that decides whether such a server is needed
(the bundle has an inference.py and the service has no server of its own); `open_service`
builds a service through the one factory and gives it those endpoints for a `with` block.

A loopback server never answers model management. A *locked* one (what `serve --api-keys`
gives its handlers, beside the keyed port) answers only its own handlers: its REST API under a
secret path prefix that only `context.rest_uri` carries (anything else is 404), its gRPC API
on a Unix socket in a folder only this user may enter (`context.grpc_uri`, `context.channel`;
no TCP port, so `context.grpc_port` is None).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from tfservo.core.settings import Settings
from tfservo.service.factory import ModelService, build_service

if TYPE_CHECKING:
    from tfservo.grpc.server import GrpcServer

__all__ = ["HandlerEndpoints", "LoopbackServer", "open_service", "start_handler_endpoints"]

_GRACE_SECONDS = 5.0  # in-process callers stop it after their own calls are done


class _SecretPrefix:
    """Requests under `prefix` reach the app with it taken off; any other gets 404."""

    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self.app, self.prefix = app, prefix
        self._raw = prefix.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(self.prefix + "/"):
            if scope["type"] == "http":
                from tfservo.http.responses import error_json

                await error_json("this port answers only this server's own handlers", 404)(scope, receive, send)
            return
        raw = scope.get("raw_path") or path.encode()
        scope = {**scope, "path": path[len(self.prefix):],
                 "raw_path": raw[len(self._raw):] if raw.startswith(self._raw) else raw}
        await self.app(scope, receive, send)


class LoopbackServer:
    """The service's REST and gRPC APIs on 127.0.0.1 (free ports) in background threads;
    `locked`: for its handlers only (the module's docstring says how)."""

    def __init__(self, service: ModelService, *, locked: bool = False) -> None:
        from tfservo.http.app import build_app
        from tfservo.server.listener import bind_socket
        from tfservo.server.run import uvicorn_config
        from tfservo.service.runtime import runtime_of

        self.service = service
        self.locked = locked
        self._sock = bind_socket("127.0.0.1", 0)
        self.port = self._sock.getsockname()[1]
        prefix = "/" + secrets.token_urlsafe(24) if locked else ""
        self.base_url = f"http://127.0.0.1:{self.port}{prefix}"
        self._folder = tempfile.mkdtemp(prefix="tfservo-handlers-") if locked else None  # mode 0700
        self._runtime = runtime_of(service)
        self._app = build_app(self._runtime)  # the serving settings: body limit, decode budget and time limits
        served: ASGIApp = _SecretPrefix(self._app, prefix) if locked else self._app
        self._server = uvicorn.Server(uvicorn_config(served, service.settings, "warning"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True, name="tfservo-loopback"
        )
        self._grpc: GrpcServer | None = None
        self._previous = (service.rest_base, service.grpc_port, service.grpc_socket)

    def start(self) -> LoopbackServer:
        from tfservo.grpc.endpoint import start_grpc

        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            threading.Event().wait(0.01)
        self.service.rest_base = self.base_url
        settings = self.service.settings
        # the server's own management choice, not "on" for being on loopback
        management = "on" if settings.management_open()[0] else "off"
        socket = os.path.join(self._folder, "grpc.sock") if self._folder else None
        loopback = settings.replace(host="127.0.0.1", grpc_port=0, grpc_socket_path=socket, api_keys=None,
                                    management=management)
        if socket is not None:
            self.service.grpc_socket = socket  # before start_grpc, which would name a port otherwise
        self._grpc = start_grpc(self._runtime, settings=loopback, log_level=logging.DEBUG, socket_only=self.locked)
        return self

    def stop(self) -> None:
        """Stop both listeners (calls in flight finish first) and restore the service's addresses."""
        if self._grpc is not None:
            self._grpc.stop(_GRACE_SECONDS).wait(_GRACE_SECONDS + 5)
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._app.close()  # its thread pools
        self._runtime.close()
        self.service.rest_base, self.service.grpc_port, self.service.grpc_socket = self._previous
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


class HandlerEndpoints:
    """The loopback servers of a service and of the services it composes (a pipeline's other
    containers, an endpoint's other variants), each for its own bundle's handlers."""

    def __init__(self, servers: list[LoopbackServer]) -> None:
        self.started = servers

    def stop(self) -> None:
        for server in self.started:
            server.stop()


def start_handler_endpoints(service: ModelService, *, members_only: bool = False) -> HandlerEndpoints | None:
    """Started loopback servers for the bundles whose handlers need one (an inference.py, and no
    server of its own), else None; stop() them when the calls are done. `members_only`: not the
    service's own bundle (`serve` gives that one its own port)."""
    found = _composed(service)[1:] if members_only else _composed(service)
    needing = [s for s in found if s.bundle_invoker.has_handlers() and s.rest_base is None]
    if not needing:
        return None
    started: list[LoopbackServer] = []
    try:
        for member in needing:
            started.append(LoopbackServer(member).start())
    except BaseException:
        HandlerEndpoints(started).stop()
        raise
    return HandlerEndpoints(started)


def _composed(service: ModelService) -> list[ModelService]:
    """The service, then every service it composes, depth first."""
    return [service, *(found for member in service.members for found in _composed(member))]


@contextmanager
def open_service(settings: Settings) -> Iterator[ModelService]:
    """The service for `settings` (through the one factory), with handler endpoints when its
    handlers need them, for the duration of a `with` block."""
    service = build_service(settings)
    try:
        loopback = start_handler_endpoints(service)
        try:
            yield service
        finally:
            if loopback is not None:
                loopback.stop()
    finally:
        service.close()
