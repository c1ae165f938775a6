"""A small file read again when it changes: key files that rotate without a restart."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from tfservo.core.errors import ServingError

__all__ = ["WatchedFile"]

log = logging.getLogger("tfservo.audit")

T = TypeVar("T")
_RECHECK_SECONDS = 1.0  # how often the file's modification time is looked at


class WatchedFile(Generic[T]):
    """`read(path)`'s value, re-read when the file's modification time changes (at most once a
    second); a new version that does not read is logged, and the previous value stays."""

    def __init__(self, path: str, read: Callable[[str], T], what: str) -> None:
        self.path = path
        self._read = read
        self._what = what
        self._lock = threading.Lock()
        self._value = read(path)  # a bad file at start is the caller's error to report
        self._mtime = _mtime(path)
        self._checked = time.monotonic()

    def current(self) -> T:
        now = time.monotonic()
        if now - self._checked >= _RECHECK_SECONDS:
            with self._lock:
                self._checked = now
                mtime = _mtime(self.path)
                if mtime != self._mtime:
                    self._mtime = mtime
                    try:
                        self._value = self._read(self.path)
                        log.info("%s: reloaded %s", self._what, self.path)
                    except ServingError as exc:
                        log.error("%s: keeping the previous version of %s: %s", self._what, self.path, exc.message)
        return self._value


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
