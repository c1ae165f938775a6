"""Graceful stop on SIGTERM/SIGINT: take no new work, finish what is in flight, exit 0.

Two phases, because an inference.py handler in flight may still call back into this server
(`context.rest_uri`, `context.channel`):
1. drain: /ping answers 503 and new requests other than TF Serving's REST API (/v1/...) and
   /metrics get 503; REST /v1 and gRPC keep answering until the in-flight invocations end.
   Every answer from now on carries `Connection: close`, so kept-alive clients open a new
   connection for their next request instead of sending it on one that is about to close;
2. stop: the listener takes no new connections, accepts those the kernel has queued, and
   closes (`listener.py`); open connections get a short linger to deliver a request already
   on its way and take its answer, then uvicorn closes the idle ones and waits for open
   requests; gRPC refuses new calls and waits for its calls in flight; then the process
   exits normally. Closing a socket that holds a connection or a request not yet read sends
   the client a reset: the accept and the linger are what keep clients from seeing one.
With --workers, phase 2 starts only once every worker has drained (`workers.py`).

A worker being replaced (`retire`) stops differently: its replacement already serves on the
same socket, so nothing is refused. It takes no new connections, answers whatever its open
connections still send with `Connection: close`, and stops once they have closed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.types import Message, Receive, Scope, Send

from tfservo.core.status import error_body
from tfservo.http.uvicorn_seam import SeamServer
from tfservo.server.listener import refuse_new_connections, wait_accepted

__all__ = ["Drain", "GracefulServer"]

log = logging.getLogger("tfservo.server")

# Paths that keep answering while draining: what handlers call back, and the scrape endpoint.
_DRAIN_OPEN = ("/v1/", "/metrics")
# How long a stop waits, with the listener closed, for open connections to finish and close.
_LINGER_SECONDS = 1.0
_CLOSE = (b"connection", b"close")


class Drain:
    """Counts the requests a stop must wait for, and refuses new ones once draining."""

    def __init__(self) -> None:
        self.draining = False
        self.retiring = False  # answers close their connections, but nothing is refused
        self.on_answer: Callable[[], None] | None = None  # called as each answer starts
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

        async def drained_app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            path = scope.get("path", "")
            if path.startswith(_DRAIN_OPEN):
                await app(scope, receive, self._closing(send))
                return
            if self.draining:
                await _refuse(path, send)
                return
            self._in_flight += 1
            try:
                await app(scope, receive, self._closing(send))
            finally:
                self._in_flight -= 1

        drained_app.app = app  # type: ignore[attr-defined]
        return drained_app

    def _closing(self, send: Send) -> Send:
        """`send` that adds `Connection: close` to an answer that starts while draining."""

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                if self.on_answer is not None:
                    self.on_answer()  # may set retiring: this answer is then the connection's last
                if self.draining or self.retiring:
                    message = {**message, "headers": [*message.get("headers", ()), _CLOSE]}
            await send(message)

        return send_closing


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _refuse(path: str, send: Send) -> None:
    if path == "/ping":
        message = "shutting down"
    else:
        message = "tfservo is shutting down (SIGTERM) and takes no new requests; send it to another instance"
    body = error_body(message)
    await send({
        "type": "http.response.start",
        "status": 503,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), _CLOSE],
    })
    await send({"type": "http.response.body", "body": body})


class GracefulServer(SeamServer):
    """uvicorn's server with the two-phase stop; `on_stop` stops the other listeners (gRPC)."""

    def __init__(
        self,
        config: uvicorn.Config,
        drain: Drain,
        on_stop: Callable[[], None],
        grace_seconds: float = 30.0,
        on_started: Callable[[], None] | None = None,
        tls_handshake_timeout: float = 60.0,
    ) -> None:
        super().__init__(config, tls_handshake_timeout)
        self.drain = drain
        self.on_stop = on_stop
        self._on_started = on_started
        self.grace_seconds = grace_seconds
        # True while other workers go on serving on the shared socket (this one is replaced):
        # then new connections must keep coming, to them, and only this copy closes.
        self.alone_stops: Callable[[], bool] = lambda: False
        self.stop_log_level = logging.INFO  # a supervisor's workers: DEBUG (it says it once for all)
        self._stopping: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def on_started(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._on_started is not None:
            self._on_started()  # accepting, and SIGTERM/SIGINT now drain: ready in earnest

    async def before_shutdown(self, sockets: list[socket.socket]) -> None:
        if not self.alone_stops() and all([refuse_new_connections(sock) for sock in sockets]):
            await wait_accepted(sockets, _LINGER_SECONDS)
        # uvloop listens on its own copy of the socket: both close.
        self.close_listeners()
        for sock in sockets:
            sock.close()
        deadline = time.monotonic() + _LINGER_SECONDS
        while self.open_connections() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def on_signal(self, sig: int) -> bool:
        if self._stopping is None:
            # First signal: stop gracefully and exit normally (uvicorn alone re-raises the
            # signal after its shutdown, so the process would die by SIGTERM, not exit 0).
            log.log(self.stop_log_level, "%s received: finishing requests in flight, taking no new ones",
                    signal.Signals(sig).name)
            self.drain.draining = True
            self._stopping = threading.Thread(target=self._stop, name="tfservo-stop", daemon=True)
            self._stopping.start()
            return True
        # A second SIGINT forces the exit. A repeated SIGTERM changes nothing: with --workers a
        # Ctrl-C reaches a worker both from the terminal and from the supervisor, and systemd
        # signals every process of the unit.
        return sig != signal.SIGINT

    def stop_accepting(self) -> None:
        """Take no new connections (others on the shared socket will); answers from now on close
        their connections. Thread-safe; for a worker being replaced."""
        if self.drain.retiring or self._loop is None:
            return
        self.drain.retiring = True
        if _running_loop() is self._loop:
            # Called as an answer starts: close now, before the client (told Connection: close)
            # can reconnect and be accepted here once more.
            self.close_listeners()
        else:
            self._loop.call_soon_threadsafe(self.close_listeners)

    def retire(self) -> None:
        """Stop once the open connections are done, refusing nothing: a replacement serves. Thread-safe."""
        self.stop_accepting()
        if self._stopping is None:
            log.info("replacement ready: this worker stops once its %d open connection(s) are done",
                     self.open_connections())
            self._stopping = threading.Thread(target=self._retire, name="tfservo-retire", daemon=True)
            self._stopping.start()

    def _retire(self) -> None:
        # An idle kept-alive connection closes after --keep-alive-timeout; a busy one after its
        # answer (Connection: close). Closing them now would race a client's next request.
        deadline = time.monotonic() + self.grace_seconds
        while self.open_connections() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop()

    def _stop(self) -> None:
        if not self.drain.wait_idle(self.grace_seconds):
            log.warning("%d invocation(s) still running after %gs; stopping anyway",
                        self.drain.in_flight, self.grace_seconds)
        try:
            self.on_stop()
        finally:
            self.request_exit()
