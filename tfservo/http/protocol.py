"""The HTTP/1.1 protocol tfservo serves with: httptools' parser, uvloop's transports, and a
connection layer of its own in place of uvicorn's (uvicorn still runs the server: listening,
workers' signals, graceful shutdown), with every answer it writes itself in JSON and limits on
slow, idle and too many clients.

Why not uvicorn's protocol: a do-nothing app served through it did ~16 000 requests/s at 32
clients on this project's machine, and ~40 000 through a minimal protocol on the same parser
and loop; most of a small request's protocol time was uvicorn's per-request bookkeeping
(docs/decisions.md, "A protocol of its own on httptools"). What it keeps of uvicorn's behaviour: keep-alive
with its timeout, pipelined requests answered in order, "Expect: 100-continue", reading paused
while an app leaves 64 KB of body unread and writing awaited while the socket's buffer is
full, HEAD, chunked bodies both ways, a JSON 500 when an app fails before answering, and
uvicorn's shutdown hooks (`connections`, `tasks`, `shutdown()`).

- malformed HTTP (a control character in a header, bytes before the request line) answers
  400 `{"error": …}`;
- a request asking for a protocol upgrade (`Upgrade: websocket`, `h2c`) answers 400 at once
  instead of waiting for a body the parser will never deliver;
- a request line longer than `max_line` bytes answers 414, a header line longer than it or
  request headers of more than `max_head` bytes in all answer 431 (nginx's defaults: 8 KB a
  line, 32 KB in all), at once and before more is buffered: an endless header costs a
  connection at most one read past the limit;
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
  from one among others (`request_context.lone_request(scope)`);
- a response's status line and headers leave with its first body bytes, in one write
  (`exchange.Exchange`);
- after each answer, while the worker holds at most two connections, its loop polls their
  sockets for up to `idle_poll` seconds instead of sleeping at once, so a kept-alive client's
  next request finds it awake (`idle_poll.IdlePoll`).

tests/http/test_http_protocol.py checks each behaviour on a real server.
"""

from __future__ import annotations

import asyncio
import resource
import urllib.parse
from collections import deque
from typing import Any

import httptools

from tfservo.codecs.media_types import JSON
from tfservo.core.status import error_body
from tfservo.http.exchange import Exchange, status_line
from tfservo.http.idle_poll import IdlePoll
from tfservo.http.request_context import new_context
from tfservo.http.uvicorn_seam import protocol_hooks

__all__ = ["ServingProtocol", "default_max_connections", "protocol_class"]

_HEADERS, _BODY = "headers", "body"  # what a part-read request still waits for
# A worker polls after an answer only while it holds this many connections or fewer: with more,
# their requests keep its loop busy, and a poll would take CPU from other work (docs/decisions.md).
_POLL_CONNECTIONS = 2


def default_max_connections() -> int:
    """Open connections per process: the file limit, less room for models, logs and sockets."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 10_000
    return max(16, min(10_000, soft - 128))


def _address(transport: asyncio.BaseTransport, key: str) -> tuple[str, int] | None:
    info = transport.get_extra_info(key)
    return (str(info[0]), int(info[1])) if isinstance(info, (tuple, list)) and len(info) >= 2 else None


class ServingProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection: requests parsed by httptools, each answered by the app in a task
    of its own (`Exchange`), one at a time and in order; JSON errors, no upgrades, and limits."""

    header_timeout: float = 10.0
    body_timeout: float = 20.0
    min_body_rate: int = 500
    max_line: int = 8192  # bytes of the request line, or of one header line
    max_head: int = 32768  # bytes of the request line and headers together
    max_connections: int = 10_000
    idle_poll: float = 0.0  # seconds; 0: no polling
    # This server's idle connections, oldest first (a dict keeps insertion order), and its loop's
    # poll (made with its first connection, when the loop is known); each server gets its own
    # through protocol_class.
    idle: dict[ServingProtocol, None] = {}
    poll: IdlePoll | None = None

    def __init__(
        self, config: Any, server_state: Any, app_state: dict[str, Any], _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        hooks = protocol_hooks(config, server_state)
        self.app = hooks.app
        self.loop = _loop or asyncio.get_event_loop()
        self.connections = hooks.connections  # uvicorn's shutdown closes these and awaits `tasks`
        self.tasks = hooks.tasks
        self.default_headers = hooks.default_headers
        self._count_answered = hooks.answered
        self.app_state = app_state
        self.root_path = hooks.root_path
        self.keep_alive_timeout = hooks.keep_alive_timeout
        self.parser = httptools.HttpRequestParser(self)
        try:  # answer the first of pipelined requests even when the client closed after sending them
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        except AttributeError:  # httptools < 0.6.3
            pass
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.exchange: Exchange | None = None  # the request parsed last (answered now, or waiting)
        self.answering: Exchange | None = None  # the request whose app runs now
        self.pipeline: deque[Exchange] = deque()  # parsed while an earlier one was being answered
        self.read_paused = False
        self.write_paused = False
        self._writable: asyncio.Future[None] | None = None
        self._url = b""
        self._head_bytes = 0  # received for the request being parsed, while its headers are still arriving
        self._head_total = 0  # of its whole header lines
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect_100 = False
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_deadline = 0.0
        self._reading: str | None = None  # _HEADERS or _BODY while a request is part-read
        self._refusing_upgrade = False
        # Kept alive since (loop time) an answer, while no request has come; one timer per
        # connection checks it, instead of a timer made and cancelled for every request.
        self._kept_alive_since: float | None = None
        self._keep_alive_timer: asyncio.TimerHandle | None = None

    # -- asyncio's Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvloop's are not subclasses
        self.connections.add(self)
        self.transport = transport
        self.server, self.client = _address(transport, "sockname"), _address(transport, "peername")
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
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
        self.connections.discard(self)
        self.idle.pop(self, None)
        self._cancel_header_timer()
        self._cancel_body_timer()
        if self._keep_alive_timer is not None:
            self._keep_alive_timer.cancel()
            self._keep_alive_timer = None
        for exchange in (self.answering, *self.pipeline):
            if exchange is not None and not exchange.complete:
                exchange.lost()
        self.resume_writing()
        if exc is None:
            self.transport.close()

    def eof_received(self) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        starting = self in self.idle  # a request's first bytes (later reads of a body are not arrivals)
        self.idle.pop(self, None)
        if starting and self.poll is not None:
            self.poll.arrived()
        self._kept_alive_since = None
        if self._reading == _HEADERS:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._answer(
                400,
                "Protocol upgrades (Upgrade: websocket, h2c) are not supported; send the request "
                "without the Upgrade and Connection: Upgrade headers",
            )
            return
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):  # raised by a callback below
                self._answer(exc.__context__.status, exc.__context__.message)
            else:
                self._answer(400, f"Malformed HTTP request ({exc}); check the request line and headers")
            return
        if self._reading == _HEADERS and self._head_bytes > self.max_head + self.max_line:
            # headers still arriving past the limit (one endless line, not yet a whole header)
            self._answer(*_head_too_large(self.max_head, "in all"))
            return
        # Timers only for a request these bytes left unfinished: most arrive whole in one read.
        if self._reading == _HEADERS and self._header_timer is None:
            self._arm_header_timer()
        elif self._reading == _BODY and self._body_timer is None:
            self._body_timer = self.loop.call_at(self._body_deadline, self._check_body_rate)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    async def drained(self) -> None:
        """Return once the transport takes writes again (or the connection is gone)."""
        if self._writable is None:
            self._writable = self.loop.create_future()
        await asyncio.shield(self._writable)

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    # -- httptools' callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._head_bytes = self._head_total = 0
        self._headers = []
        self._expect_100 = False
        self._reading = _HEADERS

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self.max_line:
            raise _HeadTooLarge(414, f"The request line is longer than {self.max_line} bytes; send long "
                                "parameters in the body (or raise --max-header-line-bytes)")

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value) + 4  # ": " and the line end
        if size > self.max_line:
            raise _HeadTooLarge(*_head_too_large(self.max_line, "in one header line"))
        self._head_total += size
        if len(self._url) + self._head_total > self.max_head:
            raise _HeadTooLarge(*_head_too_large(self.max_head, "in all"))
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_100 = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        parser = self.parser
        if parser.should_upgrade():
            self._reading = None
            self._refusing_upgrade = True  # answered by data_received, without starting the app
            return
        http_version = parser.get_http_version()
        url = httptools.parse_url(self._url)
        raw_path: bytes = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        root = self.root_path
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": http_version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": root,
            "headers": self._headers,
            "state": self.app_state.copy(),
            "method": parser.get_method().decode("ascii"),
            "path": root + path if root else path,
            "raw_path": root.encode("ascii") + raw_path if root else raw_path,
            "query_string": url.query or b"",
        }
        # Read by the app when it runs, after the loop has taken in every request of its turn.
        new_context(scope, self.requests_in_progress)
        keep_alive = http_version != "1.0" and parser.should_keep_alive()
        exchange = Exchange(self, scope, keep_alive=keep_alive, expect_100=self._expect_100)
        previous, self.exchange = self.exchange, exchange
        if previous is None or previous.complete:
            self._start(exchange)
        else:  # pipelined: answered after the ones before it
            self.pause_reading()
            self.pipeline.append(exchange)
        self._reading = _BODY
        self._body_deadline = self.loop.time() + self.body_timeout

    def on_body(self, body: bytes) -> None:
        self._body_deadline += len(body) / self.min_body_rate
        exchange = self.exchange
        if not self._refusing_upgrade and exchange is not None and not exchange.complete:
            exchange.body_arrived(body)

    def on_message_complete(self) -> None:
        self._reading = None
        self._cancel_body_timer()
        exchange = self.exchange
        if not self._refusing_upgrade and exchange is not None and not exchange.complete:
            exchange.body_ended()

    # -- requests and answers ---------------------------------------------------------------------

    def _start(self, exchange: Exchange) -> None:
        self.answering = exchange
        task = self.loop.create_task(exchange.run(self.app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def answered(self, exchange: Exchange) -> None:
        """`exchange`'s answer has been written: start the next pipelined request, or wait for one."""
        self._count_answered()
        if self.transport.is_closing():
            return
        self.resume_reading()
        if self.pipeline:
            self._start(self.pipeline.popleft())
            return
        if self.poll is not None and len(self.connections) <= _POLL_CONNECTIONS:
            self.poll.answered()
        self.idle[self] = None  # kept alive, waiting for the next request
        self._kept_alive_since = self.loop.time()
        if self._keep_alive_timer is None:
            self._keep_alive_timer = self.loop.call_later(self.keep_alive_timeout, self._check_kept_alive)

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close now when idle, else after the answer in progress."""
        exchange = self.exchange
        if exchange is None or exchange.complete:
            self.transport.close()
        else:
            exchange.keep_alive = False

    def requests_in_progress(self) -> int:
        """Requests this server holds now: its open connections that are not idle."""
        return len(self.connections) - len(self.idle)

    # -- internals ---------------------------------------------------------------------------

    def _check_kept_alive(self) -> None:
        self._keep_alive_timer = None
        since = self._kept_alive_since
        if since is None or self.transport.is_closing():
            return  # a request came (the next answer arms the timer again)
        left = since + self.keep_alive_timeout - self.loop.time()
        if left > 0:
            self._keep_alive_timer = self.loop.call_later(left, self._check_kept_alive)
        else:
            self.transport.close()

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
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.exchange is None or self.exchange.complete:
            self._answer(
                408,
                f"The request headers did not arrive within {self.header_timeout:g} s; "
                "send the whole request at once",
            )

    def _check_body_rate(self) -> None:
        self._body_timer = None
        now = self.loop.time()
        if self.read_paused:
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
        body = error_body(message)
        head = [
            status_line(status),
            *(name + b": " + value + b"\r\n" for name, value in self.default_headers),
            b"content-type: " + JSON.encode() + b"\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()


class _HeadTooLarge(Exception):
    """A request line or headers past their limit, raised in a parser callback (414 or 431)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _head_too_large(limit: int, where: str) -> tuple[int, str]:
    return 431, (f"Request headers too large: more than {limit} bytes {where}; send fewer or shorter "
                 "headers (or raise --max-header-bytes / --max-header-line-bytes)")


def protocol_class(*, header_timeout: float, max_connections: int, body_timeout: float = 20.0,
                   min_body_rate: int = 500, idle_poll: float = 0.0, max_line: int = 8192,
                   max_head: int = 32768) -> Any:
    """The protocol class for one server's limits (uvicorn instantiates it per connection)."""
    return type(
        "ServingProtocol",
        (ServingProtocol,),
        {"header_timeout": header_timeout, "max_connections": max_connections, "body_timeout": body_timeout,
         "min_body_rate": min_body_rate, "idle_poll": idle_poll, "idle": {}, "poll": None,
         "max_line": max_line, "max_head": max_head},
    )
