"""Operator logging: one line per event, TensorFlow's own noise off unless asked for."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading

__all__ = ["quiet_tensorflow", "setup_logging"]

# TF 2.21 writes glog-style lines ("I0000 00:00:… file.cc:12] …", "WARNING: All log messages
# before absl::InitializeLog()") straight to fd 2 and ignores TF_CPP_MIN_LOG_LEVEL.
_TF_NOISE = re.compile(rb"^([IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w./-]+:\d+\]|WARNING: All log messages before absl)")
_filter_started = False


def quiet_tensorflow() -> None:
    """Silence TF's C++ and absl chatter on stderr; TFSERVO_TF_LOGS=1 keeps it."""
    if os.environ.get("TFSERVO_TF_LOGS") == "1":
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    _filter_native_stderr()


def _filter_native_stderr() -> None:
    """Route fd 2 through a thread that drops TF's glog lines and passes everything else on.

    Python's own sys.stderr keeps writing to the real stderr directly, so our logs and
    tracebacks are never delayed or lost; only what native code writes to fd 2 is filtered.
    """
    global _filter_started
    if _filter_started:
        return
    try:
        real = os.dup(2)
        read_fd, write_fd = os.pipe()
    except OSError:
        return
    sys.stderr.flush()
    sys.stderr = os.fdopen(os.dup(real), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    os.dup2(write_fd, 2)
    os.close(write_fd)
    _filter_started = True

    def pump() -> None:
        with os.fdopen(read_fd, "rb") as src:
            for line in src:
                if not _TF_NOISE.match(line):
                    os.write(real, line)

    threading.Thread(target=pump, name="tfservo-stderr-filter", daemon=True).start()


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a line is logged (a CLI run inside a test runner
    swaps it, and closes its own when done)."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def setup_logging(level: str = "info") -> None:
    """Plain one-line logs to stderr."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[_StderrHandler()],
        force=True,
    )
    logging.getLogger("tensorflow").setLevel(logging.ERROR)  # deprecation notices from the TF1 loader
    for noisy in ("absl", "h5py", "botocore", "s3fs", "fsspec", "aiobotocore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
