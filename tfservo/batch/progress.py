"""Progress of a transform run: a tqdm bar on a terminal, plain periodic log lines otherwise.

Shows objects done, records, records/s and an ETA from the input bytes read (objects when
sizes are unknown), so one large file gets an honest ETA too.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import TextIO

__all__ = ["Progress"]

log = logging.getLogger("tfservo.batch")


class Progress:
    """Thread-safe counters with a display; `close()` stops it."""

    def __init__(
        self,
        objects: int,
        total_bytes: int | None,
        *,
        mode: str = "auto",
        interval: float = 10.0,
        stream: TextIO | None = None,
    ) -> None:
        self.total_objects = objects
        self.total_bytes = total_bytes or None
        self.objects = 0
        self.failed = 0
        self.records = 0
        self.bytes = 0
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if _isatty(self._stream) else "log"
        self.mode = mode
        self._bar = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if mode == "bar":
            from tqdm import tqdm

            width = _width(self._stream)
            self._bar = tqdm(
                total=self.total_bytes or objects,
                file=self._stream,
                unit="B" if self.total_bytes else "obj",
                unit_scale=True,
                dynamic_ncols=width is None,
                ncols=width,
                nrows=None if width is None else 20,  # a pty reporting 0 lines would hide the bar
                bar_format="transform {percentage:3.0f}%|{bar}| {desc} [{elapsed}<{remaining}]",
            )
            self._refresh()
        if mode in ("bar", "log"):
            self._thread = threading.Thread(target=self._tick, args=(interval if mode == "log" else 0.5,),
                                             daemon=True, name="tfservo-progress")
            self._thread.start()

    def add(self, *, objects: int = 0, failed: int = 0, records: int = 0, nbytes: int = 0) -> None:
        with self._lock:
            self.objects += objects
            self.failed += failed
            self.records += records
            self.bytes += nbytes
            if self._bar is not None:
                step = nbytes if self.total_bytes else objects
                if step:
                    self._bar.update(step)

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.records / elapsed if elapsed > 0 else 0.0

    def eta(self) -> float | None:
        """Seconds left, from the fraction of bytes (or objects) done so far."""
        elapsed = time.monotonic() - self.started
        if self.total_bytes:
            done = min(self.bytes / self.total_bytes, 1.0)
        elif self.total_objects:
            done = self.objects / self.total_objects
        else:
            return None
        if done <= 0:
            return None
        return elapsed * (1 - done) / done

    def status(self) -> str:
        failed = f" ({self.failed} failed)" if self.failed else ""
        eta = self.eta()
        eta_text = _clock(eta) if eta is not None else "?"
        return (
            f"{self.objects}/{self.total_objects} objects{failed}, {self.records} records, "
            f"{self.rate():.1f} records/s, ETA {eta_text}"
        )

    def _refresh(self) -> None:
        if self._bar is not None:
            failed = f" ({self.failed} failed)" if self.failed else ""
            self._bar.set_description_str(
                f"{self.objects}/{self.total_objects} objects{failed}, {self.records} records, "
                f"{self.rate():.1f} rec/s",
                refresh=True,
            )

    def _tick(self, interval: float) -> None:
        while not self._stop.wait(interval):
            with self._lock:
                if self._bar is not None:
                    self._refresh()
                else:
                    log.info("progress: %s", self.status())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._bar is not None:
            with self._lock:
                self._refresh()
                self._bar.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _width(stream: TextIO) -> int | None:
    """None to follow the terminal, or 100 where it reports no size (some ptys)."""
    try:
        size = os.get_terminal_size(stream.fileno())
        return None if size.columns > 0 and size.lines > 0 else 100
    except (AttributeError, ValueError, OSError):
        return 100


def _clock(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
