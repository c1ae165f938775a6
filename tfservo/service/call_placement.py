"""Where a front door's request work runs: on the event loop itself, or in a worker thread.

Handing work to a thread and back costs two thread wake-ups (~100-200 µs of GIL time under
load), more than a small model's whole call. So a small request whose recent calls of the same
kind were quick runs inline on the loop; everything else runs in a thread, so that slow models
never stall the loop. Work that may block on something else the loop must serve (batched calls
waiting for their batch, handlers calling back over HTTP) must never be placed inline: the
caller says so with `may_inline=False`.

Work in threads is grouped (by model, as the caller names it): one group may hold at most
`per_group` of the pool's threads, and at most `max_queued` more of its calls wait on the event
loop; a call beyond that raises Overloaded (503 with Retry-After) at once. So a slow model or
stuck handler can neither starve the others nor pile up waiting requests without limit.
`on_queue(pool, change)` hears of every call that starts or stops waiting (the metrics' queue
gauge).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tfservo.core.call_costs import CallCosts
from tfservo.core.errors import Overloaded
from tfservo.core.running import RunningCalls

__all__ = ["INLINE_BODY_BYTES", "CallPlacement"]

T = TypeVar("T")

# A request runs inline when its kind is quick (core.call_costs) and its body under this size.
INLINE_BODY_BYTES = 64 * 1024
_MAX_KINDS = 4096  # kinds are keyed by names clients send; forget them all beyond this


class _Group:
    """The threads one group holds, and its calls waiting for one."""

    __slots__ = ("semaphore", "users", "waiting")

    def __init__(self, limit: int) -> None:
        self.semaphore = asyncio.Semaphore(limit)
        self.users = 0
        self.waiting = 0


class CallPlacement:
    """Runs request work inline when it is known to be quick, else in a thread pool of its own."""

    def __init__(
        self, threads: int, name: str, *, inline: bool = True, per_group: int | None = None, max_queued: int = 256,
    ) -> None:
        self.inline = inline
        self.name = name
        self.per_group = per_group or max(1, threads * 3 // 4)
        self.max_queued = max_queued
        self.on_queue: Callable[[str, int], None] | None = None
        self._groups: dict[Hashable, _Group] = {}
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self.running = RunningCalls()  # its calls in progress (the oldest may be a stuck one)
        self._costs = CallCosts()

    async def run(
        self, kind: Hashable, body_bytes: int, fn: Callable[[], T], *, may_inline: bool = True,
        group: Hashable = None,
    ) -> T:
        """`fn()` inline or in a thread (in the caller's context either way); its time updates
        `kind`. In a thread it counts against `group`'s share of the pool."""
        if self.inline and may_inline and body_bytes <= INLINE_BODY_BYTES and self._costs.quick(kind):
            return self._timed(kind, fn)
        entry = self._groups.get(group)
        if entry is None:
            if len(self._groups) >= _MAX_KINDS:  # names come from clients: drop idle groups
                for key in [k for k, g in self._groups.items() if g.users == 0]:
                    del self._groups[key]
            entry = self._groups[group] = _Group(self.per_group)
        entry.users += 1
        running: asyncio.Future[T] | None = None
        try:
            if entry.semaphore.locked():
                if entry.waiting >= self.max_queued:
                    raise Overloaded(
                        f"model {group or '-'} has {self.per_group} calls running and {entry.waiting} waiting, "
                        f"its bound (--max-queued-per-model {self.max_queued}); retry shortly, or send it "
                        "to another instance"
                    )
                entry.waiting += 1
                self._queue(1)
                try:
                    await entry.semaphore.acquire()
                finally:
                    entry.waiting -= 1
                    self._queue(-1)
            else:
                await entry.semaphore.acquire()
            ctx = contextvars.copy_context()
            loop = asyncio.get_running_loop()
            running = loop.run_in_executor(self._executor, ctx.run, self._timed, kind, fn)
            # A caller that stops waiting (a time limit) leaves the call running: its thread
            # stays counted against the group until it really ends.
            return await asyncio.shield(running)
        finally:
            if running is None or running.done():
                self._leave(group, entry, running is not None)
            else:
                running.add_done_callback(lambda f: self._leave(group, entry, True, f))

    def _leave(self, group: Hashable, entry: _Group, held: bool, abandoned: asyncio.Future[Any] | None = None) -> None:
        if abandoned is not None and not abandoned.cancelled():
            abandoned.exception()  # retrieved: no one waits for it any more
        if held:
            entry.semaphore.release()
        entry.users -= 1
        if entry.users == 0 and self._groups.get(group) is entry:
            del self._groups[group]

    def _queue(self, change: int) -> None:
        if self.on_queue is not None:
            self.on_queue(self.name, change)

    def estimate(self, kind: Hashable) -> float | None:
        """The current cost estimate of `kind` in seconds (None before its first call)."""
        return self._costs.cost(kind)

    def _timed(self, kind: Hashable, fn: Callable[[], T]) -> T:
        started = time.perf_counter()
        key = self.running.begin()
        try:
            return fn()
        finally:
            self.running.end(key)
            self._costs.note(kind, time.perf_counter() - started)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
