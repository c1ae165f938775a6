"""Trying a call again after errors that may pass, with exponential back-off and jitter.

One policy for every retrying caller: transform storage reads and writes (transform/retry.py
says which errors may pass there) and calls to remote endpoints (beam/remote.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff"]

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Retry n (0-based) waits min(max_delay, base_delay·2ⁿ)·U(0.5, 1) seconds, or the error's
    own `retry_after` when it is longer; at most `retries` retries."""

    retries: int = 4
    base_delay: float = 0.5
    max_delay: float = 8.0

    def __post_init__(self) -> None:
        if self.retries < 0 or self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ValueError(
                "need retries >= 0 and 0 <= base delay <= max delay, got "
                f"{self.retries}, {self.base_delay}, {self.max_delay}"
            )

    def delay(self, retry: int, error: BaseException | None = None) -> float:
        wait = min(self.max_delay, self.base_delay * 2**retry) * random.uniform(0.5, 1.0)
        retry_after = getattr(error, "retry_after", None)
        if isinstance(retry_after, (int, float)):
            wait = min(self.max_delay, max(wait, float(retry_after)))
        return float(wait)

    def call(
        self,
        fn: Callable[[], T],
        *,
        retriable: Callable[[BaseException], bool],
        on_retry: Callable[[BaseException, int, float], None] | None = None,
    ) -> T:
        """fn(), again while it raises an error `retriable` accepts (on_retry(error, retry, wait)
        is told before each wait); the last error is raised as it is."""
        retry = 0
        while True:
            try:
                return fn()
            except Exception as exc:
                if retry >= self.retries or not retriable(exc):
                    raise
                wait = self.delay(retry, exc)
                if on_retry is not None:
                    on_retry(exc, retry, wait)
                time.sleep(wait)
                retry += 1
