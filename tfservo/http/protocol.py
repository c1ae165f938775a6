"""The HTTP/1.1 protocol tfservo serves with: uvicorn's httptools protocol, with every answer
it writes itself in JSON and limits on slow, idle and too many clients.

- malformed HTTP (a control character in a header, bytes before the request line) answers
  400 `{"error": …}` instead of uvicorn's plain-text line;
- a request asking for a protocol upgrade (`Upgrade: websocket`, `h2c`) answers 400 at once
  instead of waiting for a body the parser will never deliver;
- a connection whose request headers do not arrive within `header_timeout` seconds (an idle
  connection that never sends a request, or one dribbling a byte a second) answers 408 and
  is closed;
- a request body must arrive within `body_timeout` seconds, extended by a second for every
  `min_body_rate` bytes received (Apache's mod_reqtimeout `body=20,MinRate=500`), else 408 and
  the connection closes: a body trickling a byte a second cannot hold a connection open; time
  while tfservo itself has paused reading (the app is not reading yet) does not count;
- past `max_connections` open connections the oldest idle ones (silent since accept, or kept
  alive between requests) are closed to make room, as nginx reuses its connections; only when
  every open connection is busy with a request does a new one answer 503 and close. Idle or
  silent clients cannot use up the process's file descriptors and lock active ones out;
- each request's scope carries how many requests this server holds (its open connections less
  the idle ones), so that a door can tell a lone request, which nothing can join in a batch,
  from one among others (`lone_request(scope)`);
- a response's status line and headers leave with its first body bytes, in one write, when its
  Content-Length says a body follows (uvicorn writes them apart: two syscalls, two segments and
  two wake-ups of the client for every answer);
- after each answer, while the worker holds at most two connections, its loop polls their
  sockets for up to `idle_poll` seconds instead of sleeping at once, so a kept-alive client's
  next request finds it awake (`idle_poll.IdlePoll`).

This leans on uvicorn's internals (HttpToolsProtocol's connection, parser-callback and
response hooks), so it lives here alone, uvicorn is pinned in requirements.lock, and
tests/http/test_http_protocol.py checks each behaviour on a real server.
"""

from __future__ import annotations

import asyncio
import http
import resource
from collections.abc import Mapping
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tfservo.codecs.media_types import JSON
from tfservo.http.idle_poll import IdlePoll

__all__ = ["ServingProtocol", "default_max_connections", "lone_request", "protocol_class"]

# The scope key of a callable answering how many requests the server holds now (this one included).
_REQUESTS_IN_PROGRESS = "tfservo.requests_in_progress"
_HEADERS, _BODY = "headers", "body"  # what a part-read request still waits for
# A worker polls after an answer only while it holds this many connections or fewer: with more,
# their requests keep its loop busy, and a poll would take CPU from other work (docs/decisions.md).
_POLL_CONNECTIONS = 2


def lone_request(scope: Mapping[str, Any]) -> bool:
    """Whether the server holds no request but this one (asked when the request runs: none of
    the loop's turn is left to join its batch); False where the server does not say (an app
    called in-process)."""
    in_progress = scope.get(_REQUESTS_IN_PROGRESS)
    return in_progress is not None and in_progress() <= 1


def default_max_connections() -> int:
    """Open connections per process: the file limit, less room for models, logs and sockets."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 10_000
    return max(16, min(10_000, soft - 128))


class ServingProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with JSON errors, no upgrades, and connection limits."""

    header_timeout: float = 10.0
    body_timeout: float = 20.0
    min_body_rate: int = 500
    max_connections: int = 10_000
    idle_poll: float = 0.0  # seconds; 0: no polling
    # This server's idle connections, oldest first (a dict keeps insertion order), and its loop's
    # poll (made with its first connection, when the loop is known); each server gets its own
    # through protocol_class.
    idle: dict[ServingProtocol, None] = {}
    poll: IdlePoll | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_deadline = 0.0
        self._reading: str | None = None  # _HEADERS or _BODY while a request is part-read
        self._refusing_upgrade = False
        if self.idle_poll and self.poll is None:
            type(self).poll = IdlePoll(self.loop, self.idle_poll)
        if len(self.connections) > self.max_connections and not self._close_idle():
            self._answer(
                503,
                f"tfservo has {self.max_connections} connections open, each busy with a request, its "
                "limit; retry shortly, or start it with a larger --max-connections",
            )
            return
        self.idle[self] = None  # silent until its first byte
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.idle.pop(self, None)
        self._cancel_header_timer()
        self._cancel_body_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        starting = self in self.idle  # a request's first bytes (later reads of a body are not arrivals)
        self.idle.pop(self, None)
        if starting and self.poll is not None:
            self.poll.arrived()
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._answer(400, f"Malformed HTTP request ({exc}); check the request line and headers")
            return
        except httptools.HttpParserUpgrade:
            self._answer(
                400,
                "Protocol upgrades (Upgrade: websocket, h2c) are not supported; send the request "
                "without the Upgrade and Connection: Upgrade headers",
            )
            return
        # Timers only for a request these bytes left unfinished: most arrive whole in one read.
        if self._reading == _HEADERS and self._header_timer is None:
            self._arm_header_timer()
        elif self._reading == _BODY and self._body_timer is None:
            self._body_timer = self.loop.call_at(self._body_deadline, self._check_body_rate)

    def send_400_response(self, msg: str) -> None:
        self._answer(400, f"Malformed HTTP request: {msg}")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading = _HEADERS

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        if self.parser.should_upgrade():
            self._reading = None
            self._refusing_upgrade = True  # answered by data_received, without starting the app
            return
        super().on_headers_complete()
        self.cycle.transport = _HeadWithBody(self.transport, self.cycle)  # type: ignore[assignment]  # duck-typed
        # Read by the app when it runs, after the loop has taken in every request of its turn.
        self.scope[_REQUESTS_IN_PROGRESS] = self.requests_in_progress  # type: ignore[literal-required]
        self._reading = _BODY
        self._body_deadline = self.loop.time() + self.body_timeout

    def on_body(self, body: bytes) -> None:
        self._body_deadline += len(body) / self.min_body_rate
        if not self._refusing_upgrade:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._reading = None
        self._cancel_body_timer()
        if not self._refusing_upgrade:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.poll is not None and len(self.connections) <= _POLL_CONNECTIONS:
            self.poll.answered()
        if self.timeout_keep_alive_task is not None:  # kept alive, waiting for the next request
            self.idle[self] = None

    def requests_in_progress(self) -> int:
        """Requests this server holds now: its open connections that are not idle."""
        return len(self.connections) - len(self.idle)

    # -- internals ---------------------------------------------------------------------------

    def _close_idle(self) -> bool:
        """Close the oldest idle connections until this one fits; False if none is idle."""
        while len(self.connections) > self.max_connections:
            if not self.idle:
                return False
            oldest = next(iter(self.idle))
            del self.idle[oldest]
            self.connections.discard(oldest)  # its connection_lost comes on a later loop turn
            oldest.transport.close()
        return True

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _cancel_header_timer(self) -> None:
        self._cancel("_header_timer")

    def _cancel_body_timer(self) -> None:
        self._cancel("_body_timer")

    def _cancel(self, attribute: str) -> None:
        """Cancel the timer held in `attribute` (set in connection_made), if one is armed."""
        timer: asyncio.TimerHandle | None = getattr(self, attribute, None)
        if timer is not None:
            timer.cancel()
            setattr(self, attribute, None)

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.cycle is None or self.cycle.response_complete:
            self._answer(
                408,
                f"The request headers did not arrive within {self.header_timeout:g} s; "
                "send the whole request at once",
            )

    def _check_body_rate(self) -> None:
        self._body_timer = None
        now = self.loop.time()
        if self.flow is not None and self.flow.read_paused:
            self._body_deadline = now + self.body_timeout  # waiting on the app, not the client
        if now < self._body_deadline:
            self._body_timer = self.loop.call_later(self._body_deadline - now, self._check_body_rate)
            return
        self._answer(
            408,
            f"The request body did not arrive in time ({self.body_timeout:g} s, plus 1 s per "
            f"{self.min_body_rate} bytes received); send the body at once, or raise --body-timeout / "
            "lower --min-body-rate for slow links",
        )

    def _answer(self, status: int, message: str) -> None:
        """A complete JSON error answer, then the connection closes."""
        if self.transport.is_closing():
            return
        body = orjson.dumps({"error": message})
        head = [
            f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n".encode(),
            *(name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers),
            b"content-type: " + JSON.encode() + b"\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()


class _HeadWithBody:
    """A request's transport as its RequestResponseCycle sees it: the head of a response that
    declares a body (Content-Length > 0, not HEAD) is held until the body's first write, and both
    go out in one `writelines` (one writev). Everything else passes through."""

    __slots__ = ("_transport", "_cycle", "_head", "_started")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle
        self._head: bytes | None = None
        self._started = False  # the response's head has been written (or is held)

    def write(self, data: bytes) -> None:
        head, self._head = self._head, None
        if head is not None:
            self._transport.writelines((head, data))
            return
        cycle = self._cycle
        if (
            not self._started and cycle.response_started and cycle.expected_content_length > 0
            and not cycle.chunked_encoding and cycle.scope["method"] != "HEAD"
        ):
            self._started = True
            self._head = data  # uvicorn writes the head last in handling http.response.start
            return
        self._started = self._started or cycle.response_started
        self._transport.write(data)

    def close(self) -> None:
        """Close, writing first a head still held: uvicorn closes without writing the body when
        the app fails after its http.response.start (every body message writes, even b"")."""
        head, self._head = self._head, None
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def protocol_class(*, header_timeout: float, max_connections: int, body_timeout: float = 20.0,
                   min_body_rate: int = 500, idle_poll: float = 0.0) -> Any:
    """The protocol class for one server's limits (uvicorn instantiates it per connection)."""
    return type(
        "ServingProtocol",
        (ServingProtocol,),
        {"header_timeout": header_timeout, "max_connections": max_connections, "body_timeout": body_timeout,
         "min_body_rate": min_body_rate, "idle_poll": idle_poll, "idle": {}, "poll": None},
    )
