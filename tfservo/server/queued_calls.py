"""Predicts from an event loop, queued for their batch without a thread per call: what every
front door (HTTP's inference routes, the gRPC services) does with a small batched predict.

A door decodes the request on its loop into a `Prepared` (the version held, the model call, and
how the answer is written in the door's protocol); the batcher runs the call with others and
its batch thread writes the answer and hands it straight back to the loop — one thread hand-off
instead of three. What the batcher does not take runs in one of the door's `CallPlacement`
threads, decoded once all the same.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, TypeVar

from tfservo.core.dataplane import Answer, Call
from tfservo.server.call_placement import INLINE_BODY_BYTES, INLINE_SECONDS, CallPlacement

if TYPE_CHECKING:
    from tfservo.core.api import TFServingAPI
    from tfservo.models.servables import ServableHandle

__all__ = ["Prepared", "QueuedCalls"]

T = TypeVar("T")

# A request decoded by its door: the version held, the model call, and how its answer is written
# in the door's protocol (on the batch thread when queued).
Prepared = tuple["ServableHandle", Call, Callable[[Answer], T]]


def _settle(future: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]  # set when error is None


class QueuedCalls:
    """One door's queued predicts: `batched` says whether the service batches at all; the
    count of predicts in flight (on the loop: no lock) lets a lone one skip the batch thread."""

    def __init__(self, api: TFServingAPI, *, batched: bool) -> None:
        self.api = api
        self.batched = batched
        self._predicting = 0

    def queueable(self, body_bytes: int) -> bool:
        """Whether a request of this size may be decoded on the loop and queued (`queued`)."""
        return self.batched and body_bytes <= INLINE_BODY_BYTES

    async def queued(
        self, placement: CallPlacement, kind: Hashable, group: str | None, prepare: Callable[[], Prepared[T]],
    ) -> T:
        """`prepare()` on the loop, then its call queued for its batch; the answer as the door
        writes it. A predict that is the only one in flight runs at once on the loop when its
        model's batcher is idle too (adaptive batching's "eager when idle", without a hand-off)."""
        self._predicting += 1
        try:
            # One turn of the loop first: requests that arrived with this one count themselves.
            await asyncio.sleep(0)
            alone = self._predicting == 1 and (placement.estimate(kind) or 1.0) < INLINE_SECONDS
            started = time.perf_counter()
            prepared = prepare()
            handle, call, finish = prepared
            loop = asyncio.get_running_loop()
            loop_thread = threading.get_ident()
            answer: asyncio.Future[T] = loop.create_future()

            def done(result: Answer | None, error: BaseException | None) -> None:
                out = None
                if error is None:
                    assert result is not None
                    try:
                        out = finish(result)
                    except Exception as exc:  # an answer that cannot be written
                        error = exc
                if threading.get_ident() == loop_thread:
                    _settle(answer, out, error)
                else:
                    loop.call_soon_threadsafe(_settle, answer, out, error)

            try:
                queued = self.api.submit(handle, call, done, alone=alone)
            except BaseException:
                handle.release()
                raise
            if queued:
                result = await answer
                placement.note(kind, time.perf_counter() - started)  # quick calls may run on the loop
                return result
        finally:
            self._predicting -= 1
        return await placement.run(kind, 0, lambda: self.run_prepared(prepared), may_inline=False, group=group)

    def run_prepared(self, prepared: Prepared[T]) -> T:
        """A decoded request run in this thread, waiting for its batch if any; its version is
        released after."""
        handle, call, finish = prepared
        with handle as sv:
            return finish(self.api.run(sv, call))
