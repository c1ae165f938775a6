"""Data capture at the HTTP edge: every hot route the route table marks capturable passes
through here, so /invocations, the runtime API, /models/{name}/invoke (and, asked for, TF
Serving's and V2's inference routes) are captured in one place, handlers or not.

A sampled request's body and answer are kept as they pass (the request's chunks joined once)
and handed to the capture writer after the answer is sent; the writer formats and writes off
the request path. Only answered requests (2xx) are captured: an error has no model output.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tfservo.capture.writer import CaptureEvent, CaptureWriter
from tfservo.http.routes import CAPTURE_KEY

__all__ = ["HttpCapture"]

_INFERENCE_ID = b"x-amzn-sagemaker-inference-id"


class HttpCapture:
    """Samples the requests of the route kinds in `kinds` and gives them to `writer`."""

    def __init__(self, writer: CaptureWriter, kinds: Collection[str]) -> None:
        self.writer = writer
        self.kinds = frozenset(kinds)
        self.percentage = writer.config.sampling_percentage if writer.config.enabled else 0.0

    def wrap(self, scope: Scope, handler: ASGIApp) -> ASGIApp:
        """`handler`, tapped when this request's route is captured and it is sampled."""
        if scope.get(CAPTURE_KEY) not in self.kinds or random.random() * 100 >= self.percentage:
            return handler
        return lambda scope, receive, send: self._tapped(handler, scope, receive, send)

    async def _tapped(self, handler: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        arrived = time.time()
        body: list[bytes] = []
        answer: list[bytes] = []
        start: dict[str, object] = {}

        async def receive_kept() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.append(message.get("body", b""))
            return message

        async def send_kept(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                answer.append(message.get("body", b""))
            await send(message)

        await handler(scope, receive_kept, send_kept)
        status = start.get("status")
        if isinstance(status, int) and 200 <= status < 300:
            self.writer.submit(CaptureEvent(
                request_body=b"".join(body),
                request_type=_header(scope.get("headers", ()), b"content-type"),
                response_body=b"".join(answer),
                response_type=_header(start.get("headers", ()), b"content-type"),  # type: ignore[arg-type]
                inference_id=_header(scope.get("headers", ()), _INFERENCE_ID),
                time=arrived,
            ))


def _header(headers: Collection[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None
