"""Answers compressed when the client asks (`Accept-Encoding: gzip` or `deflate`, as
tritonclient's `response_compression_algorithm` and curl's `--compressed` send it), on every
HTTP route, wrapped once around the app.

An answer is compressed only when it is one complete body of at least `MIN_BYTES` (one TCP
segment: below it compression saves no packet; bench/v2_transport_bench.py), not already
encoded, and smaller compressed. Level 1 keeps ~95 % of level 6's saving for a third to a sixth
of its CPU (bench/results/response_compression.json). Requests that do not ask pass straight
through: the only cost is looking for the header.
"""

from __future__ import annotations

import zlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["MIN_BYTES", "ResponseEncoding"]

MIN_BYTES = 1400
LEVEL = 1
_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}


def accepted_coding(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The coding to answer in: gzip, else deflate, where Accept-Encoding lists it without q=0."""
    for key, value in headers:
        if key == b"accept-encoding":
            offered = {}
            for item in value.lower().split(b","):
                coding, _, params = item.strip().partition(b";")
                q = params.strip().removeprefix(b"q=") if params.strip().startswith(b"q=") else b"1"
                try:
                    offered[coding.strip()] = float(q)
                except ValueError:
                    continue
            for coding in (b"gzip", b"deflate"):
                if offered.get(coding, offered.get(b"*", 0.0)) > 0:
                    return coding
            return None
    return None


class ResponseEncoding:
    """The app with its answers compressed for clients that ask."""

    def __init__(self, app: ASGIApp, min_bytes: int = MIN_BYTES) -> None:
        self.app = app
        self.min_bytes = min_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        coding = accepted_coding(scope["headers"]) if scope["type"] == "http" else None
        if coding is None:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        passing = False

        async def encoded(message: Message) -> None:
            nonlocal start, passing
            if passing:
                await send(message)
                return
            if message["type"] == "http.response.start":
                start = message
                return
            assert start is not None, "a body before its start"
            body = message.get("body", b"")
            headers = list(start.get("headers", []))
            if message.get("more_body") or len(body) < self.min_bytes or any(k == b"content-encoding" for k, _ in headers):
                passing = True
                await send(start)
                await send(message)
                return
            squeezer = zlib.compressobj(LEVEL, zlib.DEFLATED, _WBITS[coding])
            packed = squeezer.compress(body) + squeezer.flush()
            if len(packed) >= len(body):
                packed, headers = body, headers + [(b"vary", b"accept-encoding")]
            else:
                headers = [(k, v) for k, v in headers if k != b"content-length"] + [
                    (b"content-length", str(len(packed)).encode()), (b"content-encoding", coding),
                    (b"vary", b"accept-encoding")]
            passing = True
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": packed})

        await self.app(scope, receive, encoded)
