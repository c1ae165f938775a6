"""A small table of fixed-size records that every worker process of one server shares.

What is promised per server (the failed-authentication throttle) has to hold across the
workers, which are separate processes: the table lives in a file the supervisor creates in its
state folder (`create_table`), each worker maps it (`SharedTable(path)`), and every read and
write holds an exclusive `flock` on it (plus a thread lock, since flock does not exclude threads
of one process). Without a path it is private to the process (one worker, tests).

Records are found by a 16-byte digest of their key, in a bounded probe from the key's home
slot; when no probed slot is free, `evictable` chooses which record gives its place. Reads may glance without the
lock (`get` outside `locked()`): the common question, "is this key in the table at all?", is
then answered without a system call.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["SharedTable", "TableFull", "create_table"]

_DIGEST = 16
_PROBE = 64  # slots tried from a key's home slot
_FREE = bytes(_DIGEST)  # never used: a probe for a key stops here
_GONE = b"\xff" * _DIGEST  # a deleted record: probes go on past it, a new record may take it


class TableFull(Exception):
    """No probed slot is free for a new record and the caller lets none be evicted."""


def create_table(path: str, slots: int, record: struct.Struct) -> None:
    """Make the (zeroed) file of a table at `path`, before the processes that share it start."""
    size = slots * (_DIGEST + record.size)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


class SharedTable:
    """Records of `record`'s layout by key, in a file shared by processes (or in this one)."""

    def __init__(self, slots: int, record: struct.Struct, path: str | None = None) -> None:
        self.slots, self.record = slots, record
        self._slot_size = _DIGEST + record.size
        self._lock = threading.Lock()
        size = slots * self._slot_size
        if path is None:
            self._fd: int | None = None
            self._map = mmap.mmap(-1, size)
        else:
            self._fd = os.open(path, os.O_RDWR)
            if os.fstat(self._fd).st_size != size:
                os.close(self._fd)
                raise ValueError(f"{path} is not a table of {slots} {record.size}-byte records")
            self._map = mmap.mmap(self._fd, size)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the table for one read-modify-write, against threads and the other processes."""
        with self._lock:
            if self._fd is None:
                yield
                return
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def get(self, key: str) -> tuple[object, ...] | None:
        """The record of `key` (None: none); call it holding `locked()` for a read-modify-write,
        or without for a glance (a record being written meanwhile may read half old, half new:
        for callers to whom one stale answer does no harm, as the throttle's checks of a peer)."""
        slot = self._find(_digest(key))
        if slot is None:
            return None
        offset = slot * self._slot_size + _DIGEST
        return self.record.unpack_from(self._map, offset)

    def put(
        self, key: str, values: tuple[object, ...], evictable: Callable[[tuple[object, ...]], float] | None
    ) -> None:
        """Write the record of `key`, taking a free slot, or else the probed record with the
        lowest `evictable(record)` (None: none may go, TableFull); call it holding `locked()`."""
        digest = _digest(key)
        slot = self._find(digest)
        if slot is None:
            slot = self._free_or_evicted(digest, evictable)
        base = slot * self._slot_size
        self._map[base : base + _DIGEST] = digest
        self.record.pack_into(self._map, base + _DIGEST, *values)

    def delete(self, key: str) -> None:
        """Forget `key`; call it holding `locked()`."""
        slot = self._find(_digest(key))
        if slot is not None:
            base = slot * self._slot_size
            self._map[base : base + _DIGEST] = _GONE

    def records(self) -> Iterator[tuple[object, ...]]:
        """Every record, glanced at without the lock (for counts that may be a moment stale)."""
        for slot in range(self.slots):
            base = slot * self._slot_size
            if self._map[base : base + _DIGEST] not in (_FREE, _GONE):
                yield self.record.unpack_from(self._map, base + _DIGEST)

    def close(self) -> None:
        self._map.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _probe(self, digest: bytes) -> Iterator[int]:
        home = int.from_bytes(digest[:8], "little") % self.slots
        for step in range(min(_PROBE, self.slots)):
            yield (home + step) % self.slots

    def _find(self, digest: bytes) -> int | None:
        for slot in self._probe(digest):
            base = slot * self._slot_size
            held = self._map[base : base + _DIGEST]
            if held == digest:
                return slot
            if held == _FREE:
                return None
        return None

    def _free_or_evicted(self, digest: bytes, evictable: Callable[[tuple[object, ...]], float] | None) -> int:
        lowest, chosen = float("inf"), -1
        for slot in self._probe(digest):
            base = slot * self._slot_size
            if self._map[base : base + _DIGEST] in (_FREE, _GONE):
                return slot
            if evictable is None:
                continue
            score = evictable(self.record.unpack_from(self._map, base + _DIGEST))
            if score < lowest:
                lowest, chosen = score, slot
        if chosen < 0:
            raise TableFull(f"no free slot among the {_PROBE} probed")
        return chosen


def _digest(key: str) -> bytes:
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=_DIGEST).digest()
    return digest if digest not in (_FREE, _GONE) else b"\x01" + digest[1:]  # both mark free slots
