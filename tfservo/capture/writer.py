"""Capture lines written off the request path, into files laid out as SageMaker lays them out.

A request's answer goes out first; then `submit` makes its line of Model Monitor's format at
once, while its bodies are still in the CPU's cache, and queues it (never blocking: past
`max_queued` lines, or while paused for a full disk, the event is dropped and counted). Before
each write the disk is asked whether these lines would take it past `max_disk_percent`: if so
capture pauses (the lines are dropped, counted) instead of filling it, and while paused the
writer asks again every second, resuming by itself once space returns. A write that fails
anyway (the disk filled from elsewhere) cuts the file back to its last whole line and publishes
it, so no line counted as captured stays unpublished and no temporary file is left. A
writer thread of the worker appends what is queued to the open file whenever 256 KB have
gathered and at least every 0.2 s, with one `writev` that releases the interpreter's lock, so
a kill -9 of the worker loses at most the lines still queued (a fraction of a second). A file
is written under a hidden temporary name and published — renamed to
`{endpoint}/{variant}/yyyy/mm/dd/hh/mm-ss-fff-{uuid}.jsonl` — when its hour ends, when it passes
16 MB, after `file_seconds`, or on close; files for an s3:// destination are published in a
local spool, uploaded by a second thread, then removed. A new writer (the supervisor's
replacement worker, the next start) publishes what a killed one left, its temporary files cut
at their last newline, so a published file never holds a half line.
"""

from __future__ import annotations

import atexit
import base64
import collections
import functools
import logging
import os
import queue
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import NamedTuple

import orjson

from tfservo.capture.config import CaptureConfig
from tfservo.core.processes import process_alive
from tfservo.core.queues import take_all
from tfservo.core.retry import Backoff

__all__ = ["CaptureEvent", "CaptureWriter", "capture_line", "new_event_id"]

log = logging.getLogger("tfservo.capture")

_MAX_FILE_BYTES = 16 * 2**20
_TMP_SUFFIX = ".tmp"
_WRITE_EVERY = 0.2  # seconds the writer thread waits for 256 KB of lines before it writes what it has
_WRITE_BYTES = 256 * 1024  # small enough that the lines are still in the CPU's cache when written
_IOV_MAX = 1024
_DISK_CHECK_EVERY = 1.0  # seconds between a paused writer's looks at its disk


class CaptureEvent(NamedTuple):
    """One answered invocation, as the request path hands it over (bodies are not copied); a
    tuple, so that it travels to the payload logger's sender process as plain values."""

    request_body: bytes
    request_type: str | None
    response_body: bytes
    response_type: str | None
    inference_id: str | None
    time: float  # seconds since the epoch, when the request arrived
    variant: str | None = None  # an endpoint of variants': whose folder the line goes in (None: the writer's)
    event_id: str | None = None  # the eventId a production line and its shadow's share (None: a new one)
    latency: float | None = None  # an endpoint of variants': seconds to the answer, for `tfservo compare`


def capture_line(config: CaptureConfig, event: CaptureEvent) -> bytes:
    """The event as one line of Model Monitor's capture format."""
    data: dict[str, object] = {}
    if config.capture_input:
        data["endpointInput"] = _payload(config, "INPUT", event.request_type, event.request_body)
    if config.capture_output:
        data["endpointOutput"] = _payload(config, "OUTPUT", event.response_type, event.response_body)
    metadata: dict[str, object] = {"eventId": event.event_id or new_event_id(), "inferenceTime": _iso_time(event.time)}
    if event.inference_id:
        metadata["inferenceId"] = event.inference_id
    if event.latency is not None:  # tfservo's own key (variants and shadows only): what compare reads
        metadata["latencyMs"] = round(event.latency * 1000, 3)
    return orjson.dumps({"captureData": data, "eventMetadata": metadata, "eventVersion": "0"},
                        option=orjson.OPT_APPEND_NEWLINE)


_VERSION_4 = (0x4000 << 64) | (0x8000 << 48)
_NOT_VERSION = ~((0xF000 << 64) | (0xC000 << 48))


def new_event_id() -> str:
    """A random (version 4) UUID from `random`, which is reseeded in every process and after
    every fork, in a third of uuid.uuid4()'s time (no system call): one per line."""
    h = (random.getrandbits(128) & _NOT_VERSION | _VERSION_4).to_bytes(16, "big").hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@functools.lru_cache(maxsize=4)
def _iso_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))


def _iso_time(when: float) -> str:
    """`when` as SageMaker writes inferenceTime: UTC to the millisecond, with a Z."""
    second, milli = divmod(int(when * 1000), 1000)
    return f"{_iso_second(second)}{milli:03d}Z"


def _payload(config: CaptureConfig, mode: str, content_type: str | None, body: bytes) -> dict[str, str]:
    encoding = config.encoding(content_type)
    text = None
    if encoding != "BASE64":
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            encoding = "BASE64"  # declared text, but not UTF-8: kept byte for byte
    if text is None:
        text = base64.b64encode(body).decode("ascii")
    return {"observedContentType": content_type or "", "mode": mode, "data": text, "encoding": encoding}


class CaptureWriter:
    """Writes the capture of one endpoint variant; `submit` from any thread, `close` once."""

    def __init__(
        self,
        config: CaptureConfig,
        *,
        endpoint: str,
        variant: str,
        spool: str | None = None,
        file_seconds: float = 60.0,
        max_disk_percent: float = 75.0,
        max_queued: int = 10_000,
        on_event: Callable[[str, int], None] = lambda kind, n: None,
    ) -> None:
        self.config = config
        self.max_queued = max_queued
        self.on_event = on_event  # ("captured" | "dropped_queue" | "dropped_disk" | "paused" | "uploaded" | ..., n)
        self._variant = variant

        def files(name: str) -> _CaptureFiles:
            return _CaptureFiles(config, endpoint, name, spool, file_seconds, max_disk_percent, on_event)

        self._new_files = files
        self._files = files(variant)
        self._by_variant = {variant: self._files}  # an endpoint of variants: a folder each, made on first line
        self._queued: collections.deque[tuple[float, bytes, str]] = collections.deque()
        self._queued_bytes = 0  # when to wake the writer early: a hint, so unlocked across threads
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._write_loop, name="tfservo-capture", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def submit(self, event: CaptureEvent) -> None:
        """Queue the event's line for writing; dropped (and counted) when the queue is full or
        capture paused."""
        if self._files.paused:
            self.on_event("dropped_disk", 1)
            return
        if self._closed or len(self._queued) >= self.max_queued:
            self.on_event("dropped_queue", 1)
            return
        line = capture_line(self.config, event)
        self._queued.append((event.time, line, event.variant or self._variant))
        self._queued_bytes += len(line)
        if self._queued_bytes >= _WRITE_BYTES and not self._wake.is_set():
            self._wake.set()  # takes a lock and wakes the writer: once per batch, not per line

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, publish the open file and (s3://) upload every published file."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(timeout)
        self._write(self._take())
        for files in self._by_variant.values():
            files.close(timeout)

    def _take(self) -> list[tuple[float, bytes, str]]:
        self._queued_bytes = 0
        return take_all(self._queued)

    def _write(self, lines: list[tuple[float, bytes, str]]) -> None:
        """Each variant's lines to its own files (one variant's, in the common case, at once)."""
        if all(variant == self._variant for _, _, variant in lines):
            self._files.write([(when, line) for when, line, _ in lines])
            return
        grouped: dict[str, list[tuple[float, bytes]]] = {}
        for when, line, variant in lines:
            grouped.setdefault(variant, []).append((when, line))
        for variant, group in grouped.items():
            if variant not in self._by_variant:
                self._by_variant[variant] = self._new_files(variant)
            self._by_variant[variant].write(group)

    def _write_loop(self) -> None:
        while not self._closed:
            self._wake.wait(_WRITE_EVERY)
            self._wake.clear()
            try:
                if self._queued:
                    self._write(self._take())
                elif self._files.paused:
                    self._files.recheck()  # nothing comes while paused: look at the disk again
                for files in list(self._by_variant.values()):
                    files.rotate_if_due()
            except Exception:  # a folder removed under it, say: later lines must still be written
                log.exception("data capture: writing or publishing a file failed")


class _CaptureFiles:
    """The writer thread's side: lines into files, files published and uploaded."""

    def __init__(
        self,
        config: CaptureConfig,
        endpoint: str,
        variant: str,
        spool: str | None,
        file_seconds: float,
        max_disk_percent: float,
        on_event: Callable[[str, int], None],
    ) -> None:
        self.remote = config.destination.startswith("s3://")
        self.file_seconds = file_seconds
        self.max_disk_percent = max_disk_percent
        self.on_event = on_event
        self.paused = False
        base = f"{endpoint}/{variant}"
        if self.remote:
            self.remote_root = config.destination.rstrip("/") + "/" + base
            spool_root = spool or os.path.join(tempfile.gettempdir(), "tfservo-capture")
            self.root = os.path.join(spool_root, config.destination.removeprefix("s3://").strip("/"), base)
        else:
            self.remote_root = ""
            self.root = os.path.join(os.path.abspath(config.destination.removeprefix("file://")), base)
        os.makedirs(self.root, exist_ok=True)
        self._lock = threading.Lock()  # the writer thread, and close() once it has stopped
        self._fd = -1
        self._file_path = ""  # the temporary name
        self._file_hour = -1  # hours since the epoch
        self._file_opened = 0.0
        self._file_bytes = 0
        self._disk_checked = 0.0
        self._uploads: queue.Queue[str | None] = queue.Queue()
        self._recover()
        self._uploader: threading.Thread | None = None
        if self.remote:
            self._uploader = threading.Thread(target=self._upload_loop, name="tfservo-capture-upload", daemon=True)
            self._uploader.start()
            for path in self._published_here():  # published by a previous run, not yet uploaded
                self._uploads.put(path)

    def write(self, lines: list[tuple[float, bytes]]) -> None:
        """Append (arrival time, line) pairs, each to the file of its arrival's hour."""
        if not lines:
            return
        with self._lock:
            try:
                fits = self._fitting(lines)
            except OSError:  # its folder was removed: _open_for makes it again
                fits = len(lines)
            if fits < len(lines):
                self.on_event("dropped_disk", len(lines) - fits)
                lines = lines[:fits]
            start = 0
            while start < len(lines):
                hour = int(lines[start][0] // 3600)
                end = start + 1
                while end < len(lines) and int(lines[end][0] // 3600) == hour:
                    end += 1
                self._append(hour, [line for _, line in lines[start:end]])
                start = end

    def recheck(self) -> None:
        """While paused: look at the disk again (at most every _DISK_CHECK_EVERY s), resuming
        once the lines to come fit under the mark."""
        with self._lock:
            if time.monotonic() - self._disk_checked < _DISK_CHECK_EVERY:
                return
            try:  # room for a write's worth (a twentieth of a small disk) resumes it
                self._room_for(min(_WRITE_BYTES, shutil.disk_usage(self.root).total // 20))
            except OSError:
                pass

    def rotate_if_due(self) -> None:
        with self._lock:
            if self._fd >= 0 and (int(time.time() // 3600) != self._file_hour or self._file_bytes >= _MAX_FILE_BYTES
                                  or time.monotonic() - self._file_opened >= self.file_seconds):
                self._publish()

    def close(self, timeout: float) -> None:
        with self._lock:
            self._publish()
        if self._uploader is not None:
            self._uploads.put(None)
            self._uploader.join(timeout)

    def _append(self, hour: int, lines: list[bytes]) -> None:
        before = self._file_bytes
        try:
            fd = self._open_for(hour)
            before = self._file_bytes  # a new file starts empty
            written = 0
            for start in range(0, len(lines), _IOV_MAX):
                written += _write_all(fd, lines[start:start + _IOV_MAX])
            self._file_bytes += written
            self.on_event("captured", len(lines))
        except OSError as exc:
            log.warning("data capture: cannot write %s (%s); %d lines lost", self._file_path or self.root, exc,
                        len(lines))
            self.on_event("dropped_error", len(lines))
            self._cut_and_publish(before)

    def _cut_and_publish(self, size: int) -> None:
        """After a failed write: the open file cut back to its `size` bytes of whole lines, then
        published (removed when empty), so what was captured is not left unpublished."""
        if self._fd < 0:
            return
        try:
            os.ftruncate(self._fd, size)
        except OSError:
            pass
        if size:
            self._publish()
            return
        os.close(self._fd)
        self._fd = -1
        try:
            os.remove(self._file_path)
        except OSError:
            pass

    def _open_for(self, hour: int) -> int:
        if self._fd >= 0 and os.fstat(self._fd).st_nlink == 0:  # removed (its folder deleted): start anew
            log.warning("data capture: %s was removed before it was published; writing to a new file",
                        self._file_path)
            os.close(self._fd)
            self._fd = -1
        if self._fd >= 0 and hour != self._file_hour:
            self._publish()
        if self._fd < 0:
            folder = os.path.join(self.root, time.strftime("%Y/%m/%d/%H", time.gmtime(hour * 3600)))
            os.makedirs(folder, exist_ok=True)
            now = time.time()
            name = time.strftime("%M-%S-", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}-{uuid.uuid4()}.jsonl"
            self._file_path = os.path.join(folder, f".{name}.{os.getpid()}{_TMP_SUFFIX}")
            self._fd = os.open(self._file_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._file_hour, self._file_opened, self._file_bytes = hour, time.monotonic(), 0
        return self._fd

    def _publish(self) -> None:
        """Close the open file and give it its published name."""
        if self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        published = _published_name(self._file_path)
        try:
            os.replace(self._file_path, published)
        except FileNotFoundError:
            log.warning("data capture: %s was removed before it was published", self._file_path)
            return
        if self.remote:
            self._uploads.put(published)

    def _fitting(self, lines: list[tuple[float, bytes]]) -> int:
        """How many of `lines` (from the first) fit on the disk below its mark; the rest pause
        capture (asked before every write: one statvfs)."""
        room = self._room_for(sum(len(line) for _, line in lines))
        if room is None:
            return len(lines)
        fits, total = 0, 0
        for _, line in lines:
            total += len(line)
            if total > room:
                break
            fits += 1
        return fits

    def _room_for(self, incoming: int) -> int | None:
        """Bytes that may still be written below max_disk_percent (SageMaker: 75 %), None when
        `incoming` bytes fit; pauses capture when they do not, resumes it when they do."""
        self._disk_checked = time.monotonic()
        usage = shutil.disk_usage(self.root)
        room = int(usage.total * self.max_disk_percent / 100.0) - usage.used
        percent = 100.0 * usage.used / usage.total if usage.total else 0.0
        if incoming <= room:
            if self.paused:
                self.paused = False
                log.info("data capture resumed: the disk under %s is %.0f%% full", self.root, percent)
                self.on_event("resumed", 1)
            return None
        if not self.paused:
            self.paused = True
            log.warning("data capture paused: the disk under %s is %.0f%% full (limit %g%%); serving goes on",
                        self.root, percent, self.max_disk_percent)
            self.on_event("paused", 1)
        return max(room, 0)

    # -- recovery and upload ----------------------------------------------------------------------

    def _recover(self) -> None:
        """Publish the temporary files of writers that are gone, cut at their last full line."""
        for folder, _, names in os.walk(self.root):
            for name in names:
                if not (name.startswith(".") and name.endswith(_TMP_SUFFIX)):
                    continue
                pid = name[: -len(_TMP_SUFFIX)].rsplit(".", 1)[-1]
                if pid.isdigit() and process_alive(int(pid)):
                    continue  # another worker's open file
                path = os.path.join(folder, name)
                _cut_at_last_line(path)
                if os.path.getsize(path):
                    os.replace(path, _published_name(path))
                else:
                    os.remove(path)

    def _published_here(self) -> list[str]:
        return sorted(
            os.path.join(folder, name) for folder, _, names in os.walk(self.root)
            for name in names if not name.startswith(".") and name.endswith(".jsonl")
        )

    def _upload_loop(self) -> None:
        import fsspec.core

        fs, _ = fsspec.core.url_to_fs(self.remote_root)
        retry = Backoff(retries=5, base_delay=1.0, max_delay=30.0)
        while (path := self._uploads.get()) is not None:
            key = self.remote_root + "/" + os.path.relpath(path, self.root).replace(os.sep, "/")
            try:
                retry.call(functools.partial(fs.put_file, path, key), retriable=lambda exc: isinstance(exc, OSError))
            except Exception as exc:  # left in the spool; the next writer retries it
                log.warning("data capture: upload of %s to %s failed (%s); kept in %s", path, key, exc, self.root)
                self.on_event("upload_failed", 1)
                continue
            os.remove(path)
            self.on_event("uploaded", 1)


def _published_name(temporary: str) -> str:
    folder, name = os.path.split(temporary)
    return os.path.join(folder, name[1:].rsplit(".", 2)[0])  # ".NAME.jsonl.PID.tmp" → "NAME.jsonl"


def _write_all(fd: int, lines: list[bytes]) -> int:
    """Write every line (one writev; the rest of a short write in a second); the bytes written."""
    total = sum(map(len, lines))
    done = os.writev(fd, lines)
    if done < total:
        rest = memoryview(b"".join(lines))[done:]
        while rest:
            rest = rest[os.write(fd, rest):]
    return total


def _cut_at_last_line(path: str) -> None:
    with open(path, "rb+") as f:
        data = f.read()
        f.truncate(data.rfind(b"\n") + 1)
