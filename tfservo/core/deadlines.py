"""A request's deadline, carried with the work it causes (a context variable): front doors set
it (REST and invocation time limits, gRPC clients' deadlines), lower layers consult it so that
work for a caller who has given up is not started (the batcher drops such rows from a batch).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from tfservo.core.errors import Code, ServingError

__all__ = ["DeadlineExceeded", "current", "expired", "remaining", "within"]

_deadline: ContextVar[float | None] = ContextVar("tfservo_deadline", default=None)
_NO_LIMIT = 365 * 24 * 3600.0  # a "deadline" further off than this is none (waits would overflow)


class DeadlineExceeded(ServingError):
    """The request's time limit passed: HTTP 504, gRPC DEADLINE_EXCEEDED."""

    code = Code.DEADLINE_EXCEEDED


def current() -> float | None:
    """The deadline (time.monotonic()) of the work running now, or None."""
    return _deadline.get()


def remaining(deadline: float | None = None) -> float | None:
    """Seconds left before `deadline` (default: the current one), or None without one."""
    deadline = current() if deadline is None else deadline
    return None if deadline is None else deadline - time.monotonic()


def expired(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


@contextmanager
def within(seconds: float | None) -> Iterator[float | None]:
    """Work inside has at most `seconds` (None or 0: no new limit; an outer, sooner one stays)."""
    if not seconds or seconds <= 0 or seconds > _NO_LIMIT:  # gRPC reports "no deadline" as ~forever
        yield current()
        return
    outer = current()
    deadline = time.monotonic() + seconds
    if outer is not None:
        deadline = min(deadline, outer)
    token = _deadline.set(deadline)
    try:
        yield deadline
    finally:
        _deadline.reset(token)
