"""The calls running now in one place (a thread pool, the model layer), by when each started: what
a watchdog reads to find a call that is stuck."""

from __future__ import annotations

import itertools
import time

__all__ = ["RunningCalls"]


class RunningCalls:
    """Start times of the calls in progress; `begin` and `end` are safe from any thread (each
    call has its own key, and the GIL makes a dict's set and delete atomic)."""

    __slots__ = ("_ids", "_started")

    def __init__(self) -> None:
        self._ids = itertools.count()  # next() is atomic under the GIL
        self._started: dict[int, float] = {}

    def begin(self) -> int:
        """A call starts now: the key that `end` takes."""
        key = next(self._ids)
        self._started[key] = time.monotonic()
        return key

    def end(self, key: int) -> None:
        """The call begun with `key` is over."""
        del self._started[key]

    def longest(self) -> float:
        """Seconds the longest call still running has run (0 when none is)."""
        starts = list(self._started.values())
        return time.monotonic() - min(starts) if starts else 0.0
