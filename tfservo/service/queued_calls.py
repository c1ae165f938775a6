"""Predicts from an event loop, queued for their batch without a thread per call: what every
front door (HTTP's inference routes, the gRPC services) does with a small batched predict.

A door decodes the request on its loop into a `Prepared` (the version held, the model call, and
how the answer is written in the door's protocol); the batcher runs the call with others and
its batch thread writes the answer and hands it straight back to the loop — one thread hand-off
instead of three. A quick model's calls are batched on the loop itself (`LoopBatches`: no
hand-off at all), and a lone request's call — its door holds no other request, so nothing can
join its batch — runs at once when the batcher is idle. What the batcher does not take runs in
one of the door's `CallPlacement` threads, decoded once all the same.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

from tfservo.core import tracing
from tfservo.models.batching.batcher import LoopBatches
from tfservo.models.calls import Answer, Call
from tfservo.service.call_placement import INLINE_BODY_BYTES, CallPlacement

if TYPE_CHECKING:
    from tfservo.models.servables import ServableHandle
    from tfservo.service.api import TFServingAPI

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


class _Mailbox:
    """Answers handed from batch threads to one event loop, one wake-up for all that arrive
    before the loop runs: a batch's callers are woken together, not one self-pipe write each."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: collections.deque[tuple[asyncio.Future[Any], Any, BaseException | None]] = collections.deque()
        self._scheduled = False

    def post(self, future: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
        self._items.append((future, result, error))
        if not self._scheduled:  # appended first: a drain that already began still sees it
            self._scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed (its server stopped): no caller is left to answer
                self._items.clear()

    def _drain(self) -> None:
        self._scheduled = False  # before taking: an answer posted from now on schedules its own
        while self._items:
            _settle(*self._items.popleft())


def _by_signature(kind: Hashable, call: Call) -> Hashable:
    """The key a call's time is kept under: its door's kind and its signature (one signature of
    a model may be quick and another slow)."""
    return (kind, call.signature_name)


class QueuedCalls:
    """One door's queued predicts: `batched` says whether the service batches at all. With
    `gather` (a door whose simultaneous requests reach its loop in one turn, as HTTP's do), a
    quick model's calls are batched on the loop (`LoopBatches`)."""

    def __init__(self, api: TFServingAPI, *, batched: bool, gather: bool = True) -> None:
        self.api = api
        self.batched = batched
        self.gather = gather
        self._mailbox: _Mailbox | None = None  # of the loop the door runs on
        self._here: LoopBatches | None = None  # the same loop's batches of quick models

    def queueable(self, body_bytes: int) -> bool:
        """Whether a request of this size may be decoded on the loop and queued (`queued`)."""
        return self.batched and body_bytes <= INLINE_BODY_BYTES

    async def queued(
        self, placement: CallPlacement, kind: Hashable, group: str | None, prepare: Callable[[], Prepared[T]],
        *, lone: bool = False,
    ) -> T:
        """`prepare()` on the loop, then its call queued for its batch; the answer as the door
        writes it. With `gather`, a quick model's call is batched on this loop with the others
        of the loop's turn (adaptive batching). `lone` (with `gather`): the door holds no other
        request, so a quick model's idle batcher runs the call at once, with no turn of the
        loop to gather."""
        prepared = _decoded(prepare)
        handle, call, finish = prepared
        loop = asyncio.get_running_loop()
        mailbox = self._mailbox
        if mailbox is None or mailbox.loop is not loop:
            mailbox = self._mailbox = _Mailbox(loop)
            self._here = LoopBatches(loop.call_soon) if self.gather else None
        if lone and self._here is not None:
            try:
                now = self.api.run_lone(handle, call, self._here)
            except BaseException:
                handle.release()
                raise
            if now is not None:
                return _encoded(finish, now)
        loop_thread = threading.get_ident()
        answer: asyncio.Future[T] = loop.create_future()

        def done(result: Answer | None, error: BaseException | None) -> None:
            out = None
            if error is None:
                assert result is not None
                try:
                    out = _encoded(finish, result)
                except Exception as exc:  # an answer that cannot be written
                    error = exc
            if threading.get_ident() == loop_thread:
                _settle(answer, out, error)
            else:
                mailbox.post(answer, out, error)

        try:
            queued = self.api.submit(handle, call, done, here=self._here)
        except BaseException:
            handle.release()
            raise
        if queued:
            return await answer
        return await self._placed(placement, _by_signature(kind, call), 0, prepared, may_inline=False, group=group)

    async def run(
        self, placement: CallPlacement, kind: Hashable, group: str | None, size: int, prepare: Callable[[], Prepared[T]],
        *, lone: bool = False,
    ) -> T:
        """A predict of `size` bytes: queued for its batch when small and batched (`queued`),
        else run in one of `placement`'s threads — or inline when calls of its signature have
        been quick and the service does not batch (nothing to wait for). A small body is decoded
        on the loop first (its signature picks the estimate), a large one in the thread. `lone`:
        see `queued`."""
        if self.queueable(size):
            return await self.queued(placement, kind, group, prepare, lone=lone)
        if size <= INLINE_BODY_BYTES:
            prepared = _decoded(prepare)
            return await self._placed(
                placement, _by_signature(kind, prepared[1]), size, prepared, may_inline=not self.batched, group=group,
            )
        return await placement.run(kind, size, lambda: self.run_prepared(_decoded(prepare)), may_inline=False, group=group)

    async def _placed(
        self, placement: CallPlacement, timed: Hashable, size: int, prepared: Prepared[T], *, may_inline: bool,
        group: str | None,
    ) -> T:
        """A decoded request run by `placement`; its version is released here when the call
        never started (refused as overloaded, or its caller gave up while it waited)."""
        started = False

        def run() -> T:
            nonlocal started
            started = True
            return self.run_prepared(prepared)

        try:
            return await placement.run(timed, size, run, may_inline=may_inline, group=group)
        except BaseException:
            if not started:  # once started, run_prepared releases it (a repeated release does nothing)
                prepared[0].release()
            raise

    def run_prepared(self, prepared: Prepared[T]) -> T:
        """A decoded request run in this thread, waiting for its batch if any; its version is
        released after."""
        handle, call, finish = prepared
        return _encoded(finish, self.api.run_held(handle, call))


def _decoded(prepare: Callable[[], Prepared[T]]) -> Prepared[T]:
    """A door's request decoded, as the request's "decode" span: the same span on every door."""
    with tracing.span("decode", leaf=True):
        return prepare()


def _encoded(finish: Callable[[Answer], T], answer: Answer) -> T:
    """An answer written in the door's protocol, as the request's "encode" span."""
    with tracing.span("encode", leaf=True):
        return finish(answer)
