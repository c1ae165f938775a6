"""Retrying transient storage errors (dropped connections, timeouts, throttling) with backoff."""

from __future__ import annotations

import errno
import io
import logging
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

from tfservo.core.retry import Backoff

__all__ = ["ATTEMPTS", "BASE_DELAY_S", "MAX_DELAY_S", "storage_error_is_transient", "retry", "RetryingReader"]

log = logging.getLogger("tfservo.batch")

T = TypeVar("T")

ATTEMPTS = 5
BASE_DELAY_S = 0.5
MAX_DELAY_S = 8.0

_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
_PERMANENT_NAMES = {
    "NoCredentialsError", "PartialCredentialsError", "ParamValidationError", "NoRegionError",
    "InvalidConfigError", "UnknownServiceError",
}
_TRANSIENT_ERRNOS = {
    errno.EIO, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED,
    errno.ECONNABORTED, errno.EPIPE, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EBUSY,
}


def storage_error_is_transient(exc: BaseException) -> bool:
    """Whether trying the same storage call again may succeed."""
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    module = type(exc).__module__ or ""
    if module.startswith(("botocore", "aiobotocore", "aiohttp", "urllib3", "requests")):
        return type(exc).__name__ not in _PERMANENT_NAMES
    if isinstance(exc, OSError):
        return exc.errno is None or exc.errno in _TRANSIENT_ERRNOS
    return False


def retry(fn: Callable[[], T], what: str, *, attempts: int = ATTEMPTS, base_delay: float = BASE_DELAY_S) -> T:
    """fn(), again after 0.5, 1, 2, 4 s (with jitter) while it fails transiently."""

    def note(exc: BaseException, retry: int, wait: float) -> None:
        log.warning("%s failed (%s: %s); retry %d of %d in %.1fs",
                    what, type(exc).__name__, exc, retry + 1, attempts - 1, wait)

    backoff = Backoff(retries=attempts - 1, base_delay=base_delay, max_delay=MAX_DELAY_S)
    return backoff.call(fn, retriable=storage_error_is_transient, on_retry=note)


class RetryingReader(io.RawIOBase):
    """A read-only stream that reopens its source at the current offset after a transient error.

    `opener(offset)` returns a binary stream positioned at `offset`. `consumed` counts the
    bytes read so far (for progress).
    """

    def __init__(self, opener: Callable[[int], BinaryIO], what: str, *, base_delay: float = BASE_DELAY_S) -> None:
        self._opener = opener
        self._what = what
        self._base_delay = base_delay
        self._stream: BinaryIO | None = None
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        def attempt() -> bytes:
            if self._stream is None:
                self._stream = self._opener(self.consumed)
            try:
                return self._stream.read(len(buffer))
            except Exception:
                self._drop()
                raise

        data = retry(attempt, f"reading {self._what} at byte {self.consumed}", base_delay=self._base_delay)
        n = len(data)
        buffer[:n] = data
        self.consumed += n
        return n

    def _drop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception:
                pass

    def close(self) -> None:
        self._drop()
        super().close()
