"""A bound on the request bodies one worker reads and decodes at once.

Decoding costs a few times a body's size (about 2.5x for a large numeric JSON body), so a few
concurrent 100 MB requests could exhaust a container's memory. Each inference request holds
its body's size (declared by Content-Length, else as read) from before it is read until it is
answered; a request that would take the total past the bound gets 503 with Retry-After
instead. One request is always let through when nothing else is held, so the bound never
refuses a body the --max-request-mb limit allows.
"""

from __future__ import annotations

from tfservo.core.memory import available_memory_bytes

__all__ = ["DecodeBudget", "default_decoding_bytes"]

_FLOOR = 256 * 2**20  # below this the default bound would refuse ordinary concurrency


class DecodeBudget:
    """Bytes of request bodies being decoded; touched only from the event loop."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.held = 0

    def hold(self, nbytes: int) -> bool:
        """Hold `nbytes` more, unless that passes the bound while something else is held."""
        if self.held and self.held + nbytes > self.limit_bytes:
            return False
        self.held += nbytes
        return True

    def release(self, nbytes: int) -> None:
        self.held -= nbytes


def default_decoding_bytes(workers: int) -> int:
    """An eighth of the memory available now, shared by `workers`, and at least 256 MiB."""
    available = available_memory_bytes() or 8 * 2**30
    return max(_FLOOR, available // 8 // max(1, workers))
