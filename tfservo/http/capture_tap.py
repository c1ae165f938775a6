"""Payloads at the HTTP edge: every hot route the route table marks capturable passes through
here, so /invocations, the runtime API, /models/{name}/invoke (and TF Serving's and V2's
inference routes) reach Data Capture and the payload logger in one place, handlers or not. Which
requests a sink takes is capture.taps' decision, the same for gRPC's inference methods.

A request some sink takes has its answer kept as it is sent, and its body as the hot route read
it (left in the scope), and both are handed to those sinks after the answer is sent; they format
and send off the request path. Data Capture takes sampled invocations answered 2xx (an error has
no model output); the payload logger, as KServe's, every request of every inference route.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Collection

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tfservo.capture.taps import Tap, Taps
from tfservo.capture.writer import CaptureEvent
from tfservo.http.request_context import context_of

__all__ = ["HttpCapture"]

_INFERENCE_ID = b"x-amzn-sagemaker-inference-id"


class HttpCapture:
    """Gives the requests each tap takes to its sink."""

    def __init__(self, taps: Taps) -> None:
        self.taps = taps

    def wrap(self, scope: Scope, handler: ASGIApp) -> ASGIApp:
        """`handler`, tapped when some sink takes this request."""
        taking = self.taps.taking(context_of(scope).capture)
        if not taking:
            return handler
        return functools.partial(self._tapped, taking, handler)

    async def _tapped(self, taps: list[Tap], handler: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        arrived = time.time()
        answer: list[bytes] = []
        start: list[Message] = []

        def send_kept(message: Message) -> Awaitable[None]:
            # A plain function handing back send's own awaitable: no coroutine of its own per message.
            if message["type"] == "http.response.body":
                answer.append(message.get("body", b""))
            elif message["type"] == "http.response.start":
                start.append(message)
            return send(message)

        await handler(scope, receive, send_kept)
        status = start[0].get("status") if start else None
        if not isinstance(status, int):
            return  # no answer went out
        headers = scope.get("headers", ())
        context = context_of(scope)
        event = CaptureEvent(
            request_body=context.body or b"",
            request_type=_header(headers, b"content-type"),
            response_body=answer[0] if len(answer) == 1 else b"".join(answer),
            response_type=_header(start[0].get("headers", ()), b"content-type"),
            inference_id=_header(headers, _INFERENCE_ID),
            time=arrived,
            variant=context.variant,
            event_id=context.capture_id,
            latency=time.time() - arrived if context.variant is not None else None,
        )
        Taps.deliver(taps, event, 200 <= status < 300)


def _header(headers: Collection[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None
