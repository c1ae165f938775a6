"""The service's REST and gRPC APIs on 127.0.0.1 for in-process callers, so that handlers'
`context.rest_uri`, `grpc_uri` and `channel` answer in `tfservo invoke`, every transform
engine and the pipeline adapters exactly as they do under `tfservo serve`.

`start_handler_endpoints` is the one place that decides whether such a server is needed
(the bundle has an inference.py and the service has no server of its own); `open_service`
builds a service through the one factory and gives it those endpoints for a `with` block.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import uvicorn

from tfservo.core.settings import Settings
from tfservo.service.factory import ModelService, build_service

if TYPE_CHECKING:
    from tfservo.grpc.server import GrpcServer

__all__ = ["LoopbackServer", "open_service", "start_handler_endpoints"]

_GRACE_SECONDS = 5.0  # in-process callers stop it after their own calls are done


class LoopbackServer:
    """The service's REST and gRPC APIs on 127.0.0.1 (free ports) in background threads."""

    def __init__(self, service: ModelService) -> None:
        from tfservo.http.app import build_app
        from tfservo.server.listener import bind_socket
        from tfservo.server.run import uvicorn_config
        from tfservo.service.runtime import runtime_of

        self.service = service
        self._sock = bind_socket("127.0.0.1", 0)
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._runtime = runtime_of(service)
        self._app = build_app(self._runtime)  # the serving settings: body limit, decode budget and time limits
        self._server = uvicorn.Server(uvicorn_config(self._app, service.settings, "warning"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True, name="tfservo-loopback"
        )
        self._grpc: GrpcServer | None = None
        self._previous = (service.rest_base, service.grpc_port)

    def start(self) -> LoopbackServer:
        from tfservo.grpc.endpoint import start_grpc

        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            threading.Event().wait(0.01)
        self.service.rest_base = self.base_url
        settings = self.service.settings
        # the server's own management choice, not "on" for being on loopback
        management = "on" if settings.management_open()[0] else "off"
        loopback = settings.replace(host="127.0.0.1", grpc_port=0, grpc_socket_path=None, api_keys=None,
                                    management=management)
        self._grpc = start_grpc(self._runtime, settings=loopback, log_level=logging.DEBUG)
        return self

    def stop(self) -> None:
        """Stop both listeners (calls in flight finish first) and restore the service's addresses."""
        if self._grpc is not None:
            self._grpc.stop(_GRACE_SECONDS).wait(_GRACE_SECONDS + 5)
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._app.close()  # its thread pools
        self._runtime.close()
        self.service.rest_base, self.service.grpc_port = self._previous


def start_handler_endpoints(service: ModelService) -> LoopbackServer | None:
    """A started loopback server when the service's handlers need one (it has an inference.py
    and no server of its own), else None; stop() it when the calls are done."""
    if not service.invoker.has_handlers() or service.rest_base is not None:
        return None
    return LoopbackServer(service).start()


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
