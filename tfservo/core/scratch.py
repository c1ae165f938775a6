"""Scratch directories (bundle extractions, multi-model snapshots): copies of models that must
not outlive the process that made them. Removed at exit, and by a serving worker that leaves
with `os._exit` (which skips atexit) through `remove_scratch_dirs`; a forked child leaves its
parent's alone."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading

__all__ = ["make_scratch_dir", "remove_scratch_dirs"]

_lock = threading.Lock()
_made: list[tuple[str, int]] = []  # (path, pid of the process that made it)


def make_scratch_dir(prefix: str) -> str:
    """A new empty directory under $TMPDIR (`tempfile.mkdtemp`) that this process removes when it leaves."""
    path = tempfile.mkdtemp(prefix=prefix)
    with _lock:
        _made.append((path, os.getpid()))
    return path


def remove_scratch_dirs() -> None:
    """Remove the scratch directories this process made, with everything in them."""
    pid = os.getpid()
    with _lock:
        mine = [path for path, maker in _made if maker == pid]
        _made[:] = [(path, maker) for path, maker in _made if maker != pid]
    for path in mine:
        shutil.rmtree(path, ignore_errors=True)


atexit.register(remove_scratch_dirs)
