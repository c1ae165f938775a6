"""Load once per worker process: the one cache of what a worker loads (a transform job's model
service, a Spark Python worker's bundle), keyed by what decides it, closed together at the end.
What is cached has a `close()`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

__all__ = ["load_once", "release_loaded"]

class Closable(Protocol):
    def close(self) -> None: ...


T = TypeVar("T", bound=Closable)

_loaded: dict[Hashable, Any] = {}
_lock = threading.Lock()


def load_once(key: Hashable, load: Callable[[], T]) -> T:
    """What `load()` gives, called the first time `key` is asked for in this process."""
    with _lock:
        if key not in _loaded:
            _loaded[key] = load()
        value: T = _loaded[key]
        return value


def release_loaded() -> None:
    """Close everything loaded in this process (a driver that ran an in-process runner)."""
    with _lock:
        for value in _loaded.values():
            value.close()
        _loaded.clear()
