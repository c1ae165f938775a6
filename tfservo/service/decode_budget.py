"""A bound on the request bodies one server reads and decodes at once, across its workers.

Decoding costs a few times a body's size (about 2.5x for a large numeric JSON body), so a few
concurrent 100 MB requests could exhaust a container's memory. Each inference request holds
its body's size (declared by Content-Length, else as read) from before it is read until it is
answered; a request that would take the total past the bound gets 503 with Retry-After
instead. One request is always let through when nothing else is held, so the bound never
refuses a body the --max-request-mb limit allows.

With several workers the total is the server's: bodies of `SHARED_FROM` bytes or more are
counted in a table the supervisor shares (`create_budget_table`), a record per worker and one
for the sum; a worker that died holding bytes is found and forgotten the first time the sum
refuses a body. Smaller bodies stay in the worker's own count (the server's share of them is
bounded by its connections), so the common request makes no system call for the bound.
"""

from __future__ import annotations

import os
import struct

from tfservo.core.memory import available_memory_bytes
from tfservo.core.processes import process_alive
from tfservo.core.shared_table import SharedTable, create_table

__all__ = ["BUDGET_TABLE", "SHARED_FROM", "DecodeBudget", "create_budget_table", "default_decoding_bytes"]

BUDGET_TABLE = "decode-budget"  # its file's name in the server's shared folder
SHARED_FROM = 64 * 1024  # bodies this large or larger count in the server's table
_SLOTS = 128  # the sum and one record per worker (replacements included)
_RECORD = struct.Struct("<qq")  # (pid, bytes held); the sum's pid is 0
_TOTAL = "total"
_FLOOR = 256 * 2**20  # below this the default bound would refuse ordinary concurrency


def create_budget_table(path: str) -> None:
    """Make the zeroed table the workers of one server count their bodies in."""
    create_table(path, _SLOTS, _RECORD)


class DecodeBudget:
    """Bytes of request bodies being decoded; this worker's touched only from its event loop."""

    def __init__(self, limit_bytes: int, path: str | None = None) -> None:
        self.limit_bytes = limit_bytes
        self.held = 0  # this worker's bodies, large and small
        self._shared = 0  # of which counted in the server's table
        self._table = SharedTable(_SLOTS, _RECORD, path) if path else None
        self._pid = os.getpid()
        self._key = f"worker {self._pid}"

    def hold(self, nbytes: int) -> bool:
        """Hold `nbytes` more, unless that passes the bound while something else is held."""
        if self._table is None or nbytes < SHARED_FROM:
            if self.held and self.held + nbytes > self.limit_bytes:
                return False
            self.held += nbytes
            return True
        local = self.held - self._shared  # this worker's small bodies
        with self._table.locked():
            total = self._total()
            if (total or local) and total + local + nbytes > self.limit_bytes:
                total = self._recount()
                if (total or local) and total + local + nbytes > self.limit_bytes:
                    return False
            self._add(total, nbytes)
        self.held += nbytes
        self._shared += nbytes
        return True

    def release(self, nbytes: int) -> None:
        self.held -= nbytes
        if self._table is None or nbytes < SHARED_FROM:
            return
        with self._table.locked():
            self._add(self._total(), -nbytes)
        self._shared -= nbytes

    @property
    def server_held(self) -> int:
        """Bytes held by every worker of the server (this one's alone without a table)."""
        if self._table is None:
            return self.held
        return self._total() + self.held - self._shared

    def close(self) -> None:
        if self._table is not None:
            if self._shared:
                with self._table.locked():
                    self._add(self._total(), -self._shared)
                self._shared = 0
            self._table.close()
            self._table = None

    def _total(self) -> int:
        record = self._table.get(_TOTAL) if self._table else None
        return int(record[1]) if record else 0  # type: ignore[call-overload]

    def _add(self, total: int, nbytes: int) -> None:
        assert self._table is not None
        self._table.put(_TOTAL, (0, total + nbytes), _never)
        self._table.put(self._key, (self._pid, self._shared + nbytes), _never)

    def _recount(self) -> int:
        """The sum again from the workers alive (a killed worker's bytes are forgotten)."""
        assert self._table is not None
        total = 0
        for pid, held in list(self._table.records()):
            if not pid:
                continue
            if pid == self._pid or process_alive(int(pid)):  # type: ignore[call-overload]
                total += int(held)  # type: ignore[call-overload]
            else:
                self._table.delete(f"worker {pid}")
        self._table.put(_TOTAL, (0, total), _never)
        return total


def _never(record: tuple[object, ...]) -> float:
    return float("inf") if record[0] == 0 else 0.0  # the sum is never evicted


def default_decoding_bytes(workers: int, shared: bool = False) -> int:
    """An eighth of the memory available now, at least 256 MiB: the server's when `shared` (its
    workers count in one table), else split among `workers`."""
    available = available_memory_bytes() or 8 * 2**30
    return max(_FLOOR, available // 8 // (1 if shared else max(1, workers)))
