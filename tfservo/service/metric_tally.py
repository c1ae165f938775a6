"""Metric updates gathered in memory and written to prometheus_client's values in bulk.

In multiprocess mode every update of a counter, gauge or histogram writes the worker's mmap
file (1–2 µs each; a request at one client made 9). A `Tally` keeps each update as one tuple
appended to a deque (no lock, no write) and a daemon thread writes the sums every `period`
seconds (20 ms) while updates come, and sleeps when none do: one write per changed value
instead of one per update, none on the request path, and another worker's /metrics sees an
update within `period`. (A 2 ms period cost more than it saved: the writer's wake-ups took
the interpreter's lock from the event loop 500 times a second.) `flush()` writes at once:
before this worker's own /metrics exposition, and when the worker stops.

Writing a histogram's sums in bulk needs its child's bucket and sum values, which
prometheus_client keeps private (`_upper_bounds`, `_buckets`, `_sum`; observe() adds one
observation only). They are used here alone; prometheus-client is pinned in
requirements.lock, and tests/server/test_metric_tally.py checks that the exposition equals the
one observe() gives.
"""

from __future__ import annotations

import bisect
import collections
import threading
from typing import Any

__all__ = ["Tally"]


class _Observed:
    """One histogram child's observations since the last write."""

    __slots__ = ("counts", "total")

    def __init__(self, buckets: int) -> None:
        self.total = 0.0
        self.counts = [0] * buckets


class Tally:
    """Counter, gauge and histogram updates, written in bulk (see the module's docstring)."""

    def __init__(self, period: float = 0.02) -> None:
        self.period = period
        self._updates: collections.deque[tuple[Any, float, bool]] = collections.deque()
        self._flushing = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._asleep = True  # the writer waits for `_wake` (or is not started yet)
        self._thread: threading.Thread | None = None

    def inc(self, child: Any, amount: float = 1.0) -> None:
        """Add `amount` to a counter's or gauge's child (negative for a gauge going down)."""
        self._updates.append((child, amount, False))
        if self._asleep:
            self._rouse()

    def observe(self, child: Any, amount: float) -> None:
        """One observation of a histogram's child."""
        self._updates.append((child, amount, True))
        if self._asleep:
            self._rouse()

    def flush(self) -> None:
        """Write every update gathered so far."""
        with self._flushing:
            pop = self._updates.popleft
            adds: collections.defaultdict[Any, float] = collections.defaultdict(float)
            observed: dict[Any, _Observed] = {}  # a histogram child → its observations' sum and bucket counts
            try:
                while True:
                    child, amount, is_observation = pop()
                    if not is_observation:
                        adds[child] += amount
                        continue
                    sums = observed.get(child)
                    if sums is None:
                        sums = observed[child] = _Observed(len(child._upper_bounds))
                    sums.total += amount
                    sums.counts[bisect.bisect_left(child._upper_bounds, amount)] += 1
            except IndexError:
                pass
            for child, amount in adds.items():
                if amount:
                    child.inc(amount)
            for child, sums in observed.items():
                child._sum.inc(sums.total)
                for bucket, count in zip(child._buckets, sums.counts):
                    if count:
                        bucket.inc(count)

    def close(self) -> None:
        """Stop the writing thread and write what is left."""
        self._stop.set()
        self._wake.set()
        self.flush()

    def _rouse(self) -> None:
        """Wake the writer (started on the first update)."""
        self._asleep = False
        if self._thread is None:
            with self._flushing:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(target=self._run, name="tfservo-metrics", daemon=True)
                    self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stop.wait(self.period):
                self.flush()
                if not self._updates:
                    self._asleep = True
                    if not self._updates:  # else one came between the check and the flag
                        break
                    self._asleep = False
