"""A short busy poll of the event loop after each answer, so that a kept-alive client's next
request finds the worker awake.

On a virtual machine whose idle vCPU halts at once (no guest halt polling, as on this
project's Firecracker machines), every request that arrives at an idle worker waits for the
vCPU to be woken, and runs on caches the host has meanwhile given to others. Linux's
cpuidle-haltpoll governor answers that by polling up to 200 µs before halting; a worker can do
the same for its own sockets: after an answer, the loop keeps turning (each turn polls the
sockets without blocking) until a request arrives or the window ends.

The window adapts as haltpoll's does, so that sparse traffic costs next to nothing: a request
that arrives after a poll gave up, but within the most after the last answer, doubles the
window; one that arrives later halves it (below an eighth of the most, polling is off until
requests come closer again).
Measurements: docs/decisions.md, "Polling after an answer".
"""

from __future__ import annotations

import asyncio
from time import perf_counter

__all__ = ["IdlePoll"]


class IdlePoll:
    """The poll of one event loop: `answered()` after each answer, `arrived()` when a request's
    first bytes come in."""

    __slots__ = ("_loop", "_most", "_least", "_window", "_until", "_last_answer", "_polling", "_arrived")

    def __init__(self, loop: asyncio.AbstractEventLoop, most_seconds: float) -> None:
        self._loop = loop
        self._most = most_seconds
        self._least = most_seconds / 8
        self._window = most_seconds
        self._until = 0.0
        self._last_answer = 0.0
        self._polling = False
        self._arrived = False

    @property
    def window(self) -> float:
        """How long the next poll lasts, in seconds (0: polling is off until requests come closer)."""
        return self._window

    def answered(self) -> None:
        """An answer left: poll for the next request for up to the window."""
        now = perf_counter()
        self._last_answer = now
        if not self._window:
            return
        self._until = now + self._window
        self._arrived = False
        if not self._polling:
            self._polling = True
            self._loop.call_soon(self._poll)

    def arrived(self) -> None:
        """A request arrived: a poll in progress has done its job. Arriving while none was, within
        the most after the last answer, lengthens the next poll; arriving later shortens it."""
        if self._polling:
            self._arrived = True
        elif perf_counter() - self._last_answer < self._most:
            self._window = min(self._most, max(self._least, self._window * 2))
        else:
            half = self._window / 2
            self._window = half if half >= self._least else 0.0

    def _poll(self) -> None:
        if self._arrived:
            self._polling = False
        elif perf_counter() < self._until:
            self._loop.call_soon(self._poll)  # while a callback is ready the loop polls without blocking
        else:
            self._polling = False
