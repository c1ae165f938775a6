"""How long the recent calls of each kind took, and whether a kind is quick enough to run on an
event loop: one rule for the server's inline requests (service.call_placement) and the
batcher's loop batches (models.batching).

A call's wall time also holds what was not its own: on a thread, the wait to take the GIL back
from the event loop (up to the 5 ms switch interval under load); on any thread, the OS running
another process meanwhile. So a kind's cost is the quickest of its last few calls: one unlucky
call moves nothing, one quick call shows what the work itself costs, and a kind that turned
slow is known after `kept` slow calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

__all__ = ["LOOP_SECONDS", "CallCosts"]

# Work that may hold an event loop: a kind of call whose cost is under this.
LOOP_SECONDS = 0.001


class CallCosts:
    """Per kind of call, the quickest of its last `kept` run times."""

    __slots__ = ("_kept", "_max_kinds", "_runs")

    def __init__(self, kept: int = 8, max_kinds: int = 4096) -> None:
        self._kept, self._max_kinds = kept, max_kinds
        self._runs: dict[Hashable, tuple[deque[float], float]] = {}

    def note(self, kind: Hashable, seconds: float) -> None:
        """One call of `kind` took `seconds`."""
        held = self._runs.get(kind)
        if held is None:
            if len(self._runs) >= self._max_kinds:
                self._runs.clear()  # kinds follow what clients send: forget them all beyond this
            runs = deque((seconds,), maxlen=self._kept)
        else:
            runs = held[0]
            runs.append(seconds)
        self._runs[kind] = (runs, min(runs))

    def cost(self, kind: Hashable) -> float | None:
        """The cost of a call of `kind` in seconds (None before its first call)."""
        held = self._runs.get(kind)
        return None if held is None else held[1]

    def quick(self, kind: Hashable) -> bool:
        """Whether calls of `kind` may run on an event loop (never before one ran)."""
        held = self._runs.get(kind)
        return held is not None and held[1] < LOOP_SECONDS
