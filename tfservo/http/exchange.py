"""One HTTP request and its answer as the app sees them: ASGI's `receive` and `send` for the
request that `ServingProtocol` parsed, and the task that runs the app on it.

A response's status line and headers are held until its first body bytes and leave with them
in one write (one syscall, one segment, one wake-up of the client), except where no body bytes
follow: a HEAD request, or a start with nothing after it (written when the app ends).
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfservo.core.status import error_body

if TYPE_CHECKING:
    from tfservo.http.protocol import ServingProtocol

__all__ = ["Exchange", "status_line"]

log = logging.getLogger("tfservo.http")

# A name or value that could split a header (RFC 9110's token and field-value characters).
_BAD_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_BAD_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
_STATUS: dict[int, bytes] = {
    int(status): b"HTTP/1.1 %d %s\r\n" % (status, http.HTTPStatus(status).phrase.encode())
    for status in http.HTTPStatus
}
# Request body bytes held for an app that has not read them yet, before reading pauses.
HIGH_WATER = 65536


def status_line(status: int) -> bytes:
    """`HTTP/1.1 <status> <reason>` and its line end."""
    return _STATUS.get(status) or b"HTTP/1.1 %d \r\n" % status


class Exchange:
    """One request's body as it arrives (`receive`) and its answer as the app writes it (`send`)."""

    __slots__ = (
        "protocol", "scope", "keep_alive", "expect_100", "chunks", "buffered", "more_body", "ready", "waiter",
        "disconnected", "started", "complete", "chunked", "length_left", "head", "head_only",
    )

    def __init__(self, protocol: ServingProtocol, scope: dict[str, Any], *, keep_alive: bool, expect_100: bool) -> None:
        self.protocol = protocol
        self.scope = scope
        self.keep_alive = keep_alive
        self.expect_100 = expect_100  # "Expect: 100-continue": the go-ahead leaves with the first receive
        self.chunks: list[bytes] = []  # body bytes not yet received by the app
        self.buffered = 0
        self.more_body = True
        self.ready = False  # something for `receive` to return: body, the body's end, a disconnect
        self.waiter: asyncio.Future[None] | None = None  # a `receive` waiting for that
        self.disconnected = False
        self.started = False  # the response's start was sent
        self.complete = False  # its last body bytes were sent
        self.chunked = False
        self.length_left = 0  # Content-Length bytes still to send
        self.head: bytes | None = None  # the status line and headers, held for the first body bytes
        self.head_only = scope["method"] == "HEAD"

    # -- the parser's side -------------------------------------------------------------------

    def body_arrived(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER:
            self.protocol.pause_reading()
        self.wake()

    def body_ended(self) -> None:
        self.more_body = False
        self.wake()

    def lost(self) -> None:
        """The connection closed: whatever the app waits for or sends from now on is moot."""
        self.disconnected = True
        self.wake()

    def wake(self) -> None:
        self.ready = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- ASGI ----------------------------------------------------------------------------------

    async def run(self, app: Callable[..., Any]) -> None:
        """The app on this request; a failure before any answer gets a JSON 500."""
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("Exception in ASGI application\n", exc_info=exc)
            if not self.started:
                await self._internal_error()
            else:
                self._close()
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned %r.", result)
                self._close()
            elif not self.started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                await self._internal_error()
            elif not self.complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self._close()

    async def receive(self) -> dict[str, Any]:
        protocol = self.protocol
        if self.expect_100 and not protocol.transport.is_closing():
            protocol.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.expect_100 = False
        if not self.disconnected and not self.complete:
            protocol.resume_reading()
            if not self.ready:
                self.waiter = protocol.loop.create_future()
                try:
                    await self.waiter
                finally:
                    self.waiter = None
            self.ready = False
        if self.disconnected or self.complete:
            return {"type": "http.disconnect"}
        chunks, self.chunks, self.buffered = self.chunks, [], 0
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: dict[str, Any]) -> None:
        protocol = self.protocol
        if protocol.write_paused and not self.disconnected:
            await protocol.drained()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got {kind!r}.")
            self._start(message["status"], message.get("headers", ()))
            return
        if self.complete:
            raise RuntimeError(f"Unexpected ASGI message {kind!r} sent, after response already completed.")
        if kind != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got {kind!r}.")
        body: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        if self.head_only:
            data = b""
        elif self.chunked:
            data = (b"%x\r\n" % len(body) + body + b"\r\n" if body else b"") + (b"" if more else b"0\r\n\r\n")
        else:
            self.length_left -= len(body)
            if self.length_left < 0:
                raise RuntimeError("Response content longer than Content-Length")
            data = body
        head, self.head = self.head, None
        if head is not None:
            data = head + data
        if data:
            protocol.transport.write(data)
        if more:
            return
        if self.length_left and not self.head_only:
            raise RuntimeError("Response content shorter than Content-Length")
        self.complete = True
        self.wake()
        if not self.keep_alive:
            protocol.transport.close()
        protocol.answered(self)

    # -- internals -----------------------------------------------------------------------------

    def _start(self, status: int, headers: Any) -> None:
        self.started = True
        self.expect_100 = False
        lines = [status_line(status)]
        lines += [name + b": " + value + b"\r\n" for name, value in self.protocol.default_headers]
        length: int | None = None
        close = False
        for name, value in headers:
            if _BAD_NAME.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if _BAD_VALUE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length" and length is None and not self.chunked:
                length = int(value)
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.chunked, length = True, None
            elif name == b"connection" and b"close" in [t.strip() for t in value.lower().split(b",")]:
                self.keep_alive, close = False, True
            lines.append(name + b": " + value + b"\r\n")
        if not self.keep_alive and not close:
            lines.append(b"connection: close\r\n")
        if length is None and not self.chunked and not self.head_only and status not in (204, 304):
            self.chunked = True
            lines.append(b"transfer-encoding: chunked\r\n")
        self.length_left = length or 0
        lines.append(b"\r\n")
        self.head = b"".join(lines)

    async def _internal_error(self) -> None:
        body = error_body("Internal Server Error")
        await self.send({"type": "http.response.start", "status": 500, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]})
        await self.send({"type": "http.response.body", "body": body})

    def _close(self) -> None:
        """Close the connection, writing first a head still held (its body never came)."""
        transport = self.protocol.transport
        head, self.head = self.head, None
        if head is not None and not transport.is_closing():
            transport.write(head)
        transport.close()
