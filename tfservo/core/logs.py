"""Operator logging: one line per event, TensorFlow's own noise off unless asked for."""

from __future__ import annotations

import contextvars
import datetime
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

import orjson

from tfservo.core import environment

__all__ = [
    "JsonFormatter", "failure_level", "library_logs_wanted", "quiet_libraries", "quiet_native_env", "quiet_tensorflow",
    "quiet_tensorflow_env", "reported_by_caller", "setup_logging",
]

# TF 2.21 writes glog-style lines ("I0000 00:00:… file.cc:12] …", "WARNING: All log messages
# before absl::InitializeLog()") straight to fd 2 and ignores TF_CPP_MIN_LOG_LEVEL. Beam's
# worker subprocesses (multi_processing) log in Python's default format ("INFO:__main__:…")
# on the fd 2 they inherit (their errors still pass). Spark's JVM names the incubator module
# it loads and, taking PySpark for its shell, the shell's log level, before its logging is set up.
_TF_NOISE = re.compile(
    rb"^([IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w./-]+:\d+\]|WARNING: All log messages before absl"
    rb"|(DEBUG|INFO|WARNING):(__main__|root|apache_beam[\w.]*):"
    rb'|WARNING: Using incubator modules: |Setting default log level to "|To adjust logging level use sc\.setLogLevel)'
)
_filter_started = False

# Set while a caller that reports each failure itself (a transform: one FAILED line per record,
# the failure report) makes a call: what fails below it logs at DEBUG, not once per retry.
_CALLER_REPORTS: contextvars.ContextVar[bool] = contextvars.ContextVar("tfservo_caller_reports", default=False)


@contextmanager
def reported_by_caller() -> Iterator[None]:
    """Within: failures below are the caller's to report (see failure_level)."""
    token = _CALLER_REPORTS.set(True)
    try:
        yield
    finally:
        _CALLER_REPORTS.reset(token)


def failure_level() -> int:
    """The level a failure that its caller may report is logged at: ERROR, DEBUG within
    reported_by_caller()."""
    return logging.DEBUG if _CALLER_REPORTS.get() else logging.ERROR


# What keeps TF's and gRPC's C++ start-up lines off; read by those libraries when they load.
_QUIET_NATIVE = (("TF_CPP_MIN_LOG_LEVEL", "2"), ("GRPC_VERBOSITY", "ERROR"))


def library_logs_wanted(env: Mapping[str, str] | None = None) -> bool:
    """TFSERVO_TF_LOGS=1: the user wants TensorFlow's, Beam's and Spark's own lines."""
    return (environment.current() if env is None else env).get("TFSERVO_TF_LOGS") == "1"


def quiet_native_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `env` (a child process's, or this one's) so that TF and gRPC
    start quietly: those it leaves unset, none when TFSERVO_TF_LOGS=1."""
    if library_logs_wanted(env):
        return {}
    return {name: value for name, value in _QUIET_NATIVE if name not in env}


def quiet_tensorflow_env() -> bool:
    """Set those variables in this process, before TensorFlow loads; True when tfservo chose
    TF's log level (so TF's Python loggers are quieted too), False when the user did."""
    added = environment.export_missing(quiet_native_env(environment.current()))
    return "TF_CPP_MIN_LOG_LEVEL" in added


def quiet_tensorflow() -> None:
    """Silence TF's C++ and absl chatter on stderr; TFSERVO_TF_LOGS=1 keeps it."""
    if library_logs_wanted():
        return
    quiet_tensorflow_env()
    _filter_native_stderr()


# Libraries whose INFO and WARNING lines are not for operators (TF's deprecation notices on
# every load, Beam's worker chatter and optional-dependency notes); errors still show.
_NOISY_LOGGERS = ("tensorflow", "absl", "apache_beam", "h5py")
_NOISY_PATHS = tuple(f"{os.sep}{name}{os.sep}" for name in ("tensorflow", "apache_beam", "absl", "keras"))


def _not_library_noise(record: logging.LogRecord) -> bool:
    """A root-logger filter: drop what those libraries log straight on the root logger."""
    return record.levelno >= logging.ERROR or not any(part in record.pathname for part in _NOISY_PATHS)


def quiet_libraries(level: str = "info") -> None:
    """TensorFlow's and Beam's noise off in this process (C++ lines on fd 2 included), unless
    TFSERVO_TF_LOGS=1 or the log level is debug; their errors still show."""
    if library_logs_wanted() or level.lower() == "debug":
        return
    quiet_tensorflow()
    for name in _NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET or logger.level < logging.ERROR:
            logger.setLevel(logging.ERROR)
    root = logging.getLogger()
    if _not_library_noise not in root.filters:
        root.addFilter(_not_library_noise)


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


if TYPE_CHECKING:  # generic in typeshed; at run time only from Python 3.11
    _StreamHandler = logging.StreamHandler[TextIO]
else:
    _StreamHandler = logging.StreamHandler


class _StderrHandler(_StreamHandler):
    """Writes to whatever sys.stderr is when a line is logged (a CLI run inside a test runner
    swaps it, and closes its own when done)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, a record's `fields` (the access
    log's), the active OpenTelemetry trace and span ids, and the exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc.update(fields)
        doc.update(_trace_ids())
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def _trace_ids() -> dict[str, str]:
    """The current OpenTelemetry span's ids (hex, as W3C traceparent writes them), if one is active."""
    trace = sys.modules.get("opentelemetry.trace")  # only if something set tracing up
    if trace is None:
        return {}
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def setup_logging(level: str = "info", fmt: str = "text", access: bool = False) -> None:
    """One-line logs to stderr (`fmt` text or json), through one handler on the root logger;
    `access`: one line per request on tfservo.access at info.

    Other root handlers are taken off but not closed: their streams are not ours (basicConfig's
    force=True would close them, and with them a test runner's or a notebook's stderr).
    """
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(
        JsonFormatter() if fmt == "json" else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    # --access-log: request lines at info; without it they are debug lines (--log-level debug)
    logging.getLogger("tfservo.access").setLevel(logging.INFO if access else logging.NOTSET)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    quiet_libraries(level)
    for noisy in ("botocore", "s3fs", "fsspec", "aiobotocore", "urllib3", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
