"""When a worker should be replaced, decided inside it: a call stuck past the hard limit (work in
a door's threads, or a model call in any thread: batch threads and the event loop too),
resident memory past the worker's limit, or its quota of requests answered. The watch then asks
the supervisor (workers.py) for a replacement, once; the worker keeps serving until the
replacement is ready, except past its memory limit, where it takes no new connections at once.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence

from tfservo.core.memory import memory_limit_bytes, resident_bytes
from tfservo.core.running import RunningCalls
from tfservo.core.settings import Settings

__all__ = ["REASONS", "WorkerWatch", "hard_limit", "worker_memory_limit"]

log = logging.getLogger("tfservo.server")

# Why workers are replaced (the reason label of tfservo_worker_replacements_total).
REASONS = ("memory", "requests", "stuck", "died")
_MIB = 2**20
_CHECK_EVERY = 0.5  # seconds between the watch thread's checks
_MEMORY_EVERY = 0.001  # at most this often a request reads the resident size (~1.5 µs a read)


def hard_limit(settings: Settings) -> float:
    """How long a call may run before its worker is replaced: twice the longest time limit; 0
    (never) without one."""
    return 2 * max(settings.request_timeout, settings.invocation_timeout)


def worker_memory_limit(settings: Settings) -> int:
    """--max-worker-memory-mb in bytes; by default 90% of the container's (or machine's) memory,
    shared by the workers and one replacement starting beside them. 0 (no guard) in
    multi-model mode: a replacement would start without the models loaded with POST /models
    (their memory is bounded by TFSERVO_MME_MEMORY_MB instead)."""
    if settings.max_worker_memory_mb > 0:
        return int(settings.max_worker_memory_mb * _MIB)
    if settings.multi_model:
        return 0
    total = memory_limit_bytes() or 8 * 2**30
    return int(total * 0.9) // (settings.workers + 1)


class WorkerWatch:
    """Watches one worker and calls `replace(reason, why)` once when it should go;
    `stop_accepting()` when its memory is past the limit."""

    def __init__(
        self,
        running: Sequence[RunningCalls],
        *,
        stuck_limit: float,
        memory_limit: int,
        max_requests: int,
        replace: Callable[[str, str], None],
        stop_accepting: Callable[[], None],
        on_memory: Callable[[int], None] = lambda rss: None,
    ) -> None:
        self.running = running  # every place this worker's calls run
        self.stuck_limit = stuck_limit
        self.memory_limit = memory_limit
        self.max_requests = max_requests
        self._replace = replace
        self._stop_accepting = stop_accepting
        self._on_memory = on_memory
        self._answered = itertools.count(1)  # next() is atomic under the GIL
        self._memory_read = 0.0
        self._asked = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="tfservo-worker-watch", daemon=True)

    def start(self) -> WorkerWatch:
        self._thread.start()
        return self

    def answering(self) -> None:
        """An HTTP answer is about to start: past the memory limit, it is the last on its
        connection (the worker has stopped accepting before its headers go out)."""
        now = time.monotonic()
        if now - self._memory_read >= _MEMORY_EVERY:
            self._memory_read = now
            self._check_memory()

    def answered(self) -> None:
        """A request was answered (any protocol): count it; check memory now and then."""
        count = next(self._answered)
        if self.max_requests and count == self.max_requests:
            self._ask("requests", f"it has answered {count} requests (--max-requests)")
        self.answering()

    def _watch(self) -> None:
        while not self._asked:
            time.sleep(_CHECK_EVERY)
            self._check_memory()
            if self.stuck_limit:
                running = max(calls.longest() for calls in self.running)
                if running > self.stuck_limit:
                    self._ask("stuck", f"a call has run {running:.0f} s, past the hard limit of "
                              f"{self.stuck_limit:g} s (twice the time limit)")

    def _check_memory(self) -> None:
        rss = resident_bytes()
        self._on_memory(rss)
        if self.memory_limit and rss > self.memory_limit:
            self._ask("memory", f"its resident memory, {rss / _MIB:.0f} MB, passed its limit of "
                      f"{self.memory_limit / _MIB:.0f} MB (--max-worker-memory-mb); it takes no new connections")
            self._stop_accepting()

    def _ask(self, reason: str, why: str) -> None:
        with self._lock:
            if self._asked:
                return
            self._asked = True
        self._replace(reason, why)
