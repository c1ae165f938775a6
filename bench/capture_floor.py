"""The floor of Data Capture: the bytes a capture must write, written by a process of their own.

Beside a server with capture off, this writes RATE lines a second, each the line Data Capture
makes for the benchmark's request and answer (tfservo.capture's own `capture_line`), in batches
of 16 with one `writev` (as capture's writer does), to a file in FOLDER, for SECONDS. No capture
can write less, so what this costs the server beside it is a floor under the cost of any
capture to that folder: the observability benchmark reports it beside the capture rows.

Usage: python capture_floor.py RATE FOLDER SECONDS BODY ANSWER
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tfservo.capture.config import CaptureConfig
from tfservo.capture.writer import CaptureEvent, capture_line

_BATCH = 16


def main(rate: float, folder: str, seconds: float, body: bytes, answer: bytes) -> None:
    config = CaptureConfig(destination=folder, json_content_types=("application/json",))
    line = capture_line(config, CaptureEvent(body, "application/json", answer, "application/json", None, time.time()))
    lines = [line] * _BATCH
    path = Path(folder, f"floor-{os.getpid()}.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    every = _BATCH / rate
    start = due = time.monotonic()
    written = 0
    try:
        while time.monotonic() - start < seconds:
            os.writev(fd, lines)
            written += _BATCH
            due += every
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
    finally:
        os.close(fd)
        path.unlink()
    print(f"capture floor: {written} lines of {len(line)} bytes in {time.monotonic() - start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2], float(sys.argv[3]), Path(sys.argv[4]).read_bytes(), Path(sys.argv[5]).read_bytes())
