"""Graceful stop on SIGTERM/SIGINT: take no new work, finish what is in flight, exit 0.

Two phases, because an inference.py handler in flight may still call back into this server
(`context.rest_uri`, `context.channel`):
1. drain: /ping answers 503 and new requests other than TF Serving's REST API (/v1/...) and
   /metrics get 503; REST /v1 and gRPC keep answering until the in-flight invocations end;
2. stop: uvicorn closes its socket and waits for open requests, gRPC refuses new calls and
   waits for its calls in flight; then the process exits normally.
With --workers, phase 2 starts only once every worker has drained (`workers.py`).
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import orjson
import uvicorn

__all__ = ["Drain", "GracefulServer"]

log = logging.getLogger("tfservo.server")

# Paths that keep answering while draining: what handlers call back, and the scrape endpoint.
_DRAIN_OPEN = ("/v1/", "/metrics")


class Drain:
    """Counts the requests a stop must wait for, and refuses new ones once draining."""

    def __init__(self) -> None:
        self.draining = False
        self._in_flight = 0  # touched only on the event loop; read by the stopping thread

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def wait_idle(self, timeout: float) -> bool:
        """Block until no drained request is in flight (True) or `timeout` passes (False)."""
        deadline = time.monotonic() + timeout
        while self._in_flight > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def asgi(self, app: Any) -> Any:
        """`app` with in-flight invocations counted and new ones refused while draining."""

        async def drained_app(scope: dict, receive: Callable, send: Callable) -> None:
            path = scope.get("path", "")
            if scope["type"] != "http" or path.startswith(_DRAIN_OPEN):
                await app(scope, receive, send)
                return
            if self.draining:
                await _refuse(path, send)
                return
            self._in_flight += 1
            try:
                await app(scope, receive, send)
            finally:
                self._in_flight -= 1

        drained_app.app = app  # type: ignore[attr-defined]
        return drained_app


async def _refuse(path: str, send: Callable) -> None:
    if path == "/ping":
        message = "shutting down"
    else:
        message = "tfservo is shutting down (SIGTERM) and takes no new requests; send it to another instance"
    body = orjson.dumps({"error": message})
    await send({
        "type": "http.response.start",
        "status": 503,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close")],
    })
    await send({"type": "http.response.body", "body": body})


class GracefulServer(uvicorn.Server):
    """uvicorn's server with the two-phase stop; `on_stop` stops the other listeners (gRPC)."""

    def __init__(
        self,
        config: uvicorn.Config,
        drain: Drain,
        on_stop: Callable[[], None],
        grace_seconds: float = 30.0,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.drain = drain
        self.on_stop = on_stop
        self.on_started = on_started
        self.grace_seconds = grace_seconds
        self._stopping: threading.Thread | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_started is not None:
            self.on_started()  # accepting, and SIGTERM/SIGINT now drain: ready in earnest

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._stopping is None:
            # First signal: stop gracefully and exit normally (uvicorn alone re-raises the
            # signal after its shutdown, so the process would die by SIGTERM, not exit 0).
            log.info("%s received: finishing requests in flight, taking no new ones", signal.Signals(sig).name)
            self.drain.draining = True
            self._stopping = threading.Thread(target=self._stop, name="tfservo-stop", daemon=True)
            self._stopping.start()
        elif sig == signal.SIGINT:
            super().handle_exit(sig, frame)  # a second SIGINT forces the exit
        # A repeated SIGTERM changes nothing: with --workers a Ctrl-C reaches a worker both from
        # the terminal and from the supervisor, and systemd signals every process of the unit.

    def _stop(self) -> None:
        if not self.drain.wait_idle(self.grace_seconds):
            log.warning("%d invocation(s) still running after %gs; stopping anyway",
                        self.drain.in_flight, self.grace_seconds)
        try:
            self.on_stop()
        finally:
            self.should_exit = True
