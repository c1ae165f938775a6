"""The processes an SDK session runs: one `tfservo serve` per endpoint, one `tfservo transform`
per transform job. Each is the tfservo command line, so what the SDK gets is what the CLI does."""

from __future__ import annotations

import collections
import logging
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence

from tfservo.core import environment
from tfservo.core.logs import quiet_native_env
from tfservo.core.settings import ConfigError, log_level_from_env
from tfservo.server.run import READY_LINE

__all__ = ["EndpointServer", "TransformRun"]

log = logging.getLogger("tfservo.sagemaker_sdk")

_TAIL_LINES = 40


def _tfservo(*args: str) -> list[str]:
    return [sys.executable, "-m", "tfservo", *args]


def _pings(url: str) -> bool:
    """Whether the server at `url` answers /ping with 200."""
    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class EndpointServer:
    """`tfservo serve` for one endpoint on loopback; `url` once `start` returned True."""

    def __init__(self, name: str, args: Sequence[str], env: Mapping[str, str]) -> None:
        self.name = name
        self.args = list(args)
        self.env = dict(env)
        self.url = ""
        self.failure: str | None = None
        self._log = tempfile.NamedTemporaryFile(prefix=f"tfservo-endpoint-{name}-", suffix=".log", delete=False)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> str:
        return self._log.name

    def start(self, timeout: float = 300.0) -> bool:
        """Start the server and wait until /ping answers 200; False (and `failure`) if it never does.

        The server picks its own free ports and says which in its log: ports chosen here and
        bound there later could be taken meanwhile by another process, whose /ping would answer."""
        command = _tfservo(
            "serve", *self.args, "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0", "--endpoint-name", self.name,
            *self._ready_line_level(),
        )
        log.info("endpoint %s: %s (log: %s)", self.name, " ".join(command[3:]), self.log_path)
        self._proc = subprocess.Popen(command, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        url = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.failure = f"tfservo serve exited with status {self._proc.returncode}:\n{self.log_tail()}"
                return False
            url = url or self._serving_url()
            if url and _pings(url):
                self.url = url
                return True
            time.sleep(0.2)
        self.stop()
        self.failure = f"tfservo serve did not answer /ping within {timeout:.0f} s:\n{self.log_tail()}"
        return False

    def _ready_line_level(self) -> list[str]:
        """--log-level info where the endpoint's environment asks for less: the ready line is info."""
        try:
            quieter = logging.getLevelName(log_level_from_env(self.env).upper()) > logging.INFO
        except ConfigError:  # not a level: the server refuses it with its own message
            quieter = False
        return ["--log-level", "info"] if quieter else []

    def _serving_url(self) -> str:
        """The URL in the server's ready line (server.run.READY_LINE), once it has logged it."""
        try:
            with open(self.log_path, errors="replace") as f:
                found = READY_LINE.search(f.read())
        except OSError:
            return ""
        return found.group("url") if found else ""

    def log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(collections.deque(f, _TAIL_LINES))
        except OSError:
            return ""

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM (requests in flight finish), then SIGKILL after `grace` seconds."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._log.close()


class TransformRun:
    """`tfservo transform` for one job, its output lines kept for the job's log."""

    def __init__(self, name: str, args: Sequence[str], env: Mapping[str, str]) -> None:
        self.name = name
        self.command = _tfservo("transform", *args, "--progress", "log")
        self.lines: list[str] = []
        self.started = time.time()
        self.ended: float | None = None
        self.stopped = False
        log.info("transform job %s: %s", name, " ".join(self.command[3:]))
        self._proc = subprocess.Popen(
            self.command, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        self._changed = threading.Condition()
        threading.Thread(target=self._read, name=f"tfservo-transform-{name}", daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        self._proc.wait()
        with self._changed:
            self.ended = time.time()
            self._changed.notify_all()

    @property
    def status(self) -> str:
        """SageMaker's TransformJobStatus."""
        if self.ended is None:
            return "Stopping" if self.stopped else "InProgress"
        if self.stopped:
            return "Stopped"
        return "Completed" if self._proc.returncode == 0 else "Failed"

    @property
    def failure_reason(self) -> str | None:
        if self.status != "Failed":
            return None
        return "\n".join(self.lines[-_TAIL_LINES:]) or f"tfservo transform exited with status {self._proc.returncode}"

    @property
    def progress(self) -> dict[str, object] | None:
        """The job's last progress line (`--progress log`: objects done of all, records, rate,
        ETA), as DescribeTransformJob's tfservo-only `TransformJobProgress`; None before the first."""
        with self._changed:
            last = next((line for line in reversed(self.lines)
                         if "progress: " in line or line.startswith(_SUMMARY_START)), None)
        if last is None:
            return None
        text = last.split("progress: ", 1)[1] if "progress: " in last else last.removeprefix(_SUMMARY_START)
        found = _PROGRESS.search(text) or _SUMMARY.search(text)
        if found is None:
            return {"Text": text}
        done, failed = int(found["done"]), int(found["failed"] or 0)
        return {"Text": text, "ObjectsDone": done, "ObjectsTotal": int(found["total"]), "ObjectsFailed": failed,
                "Records": int(found["records"]), "RecordsPerSecond": float(found["rate"])}

    def follow(self, on_line: Callable[[str], None]) -> None:
        """Call `on_line` for each output line, from the first, until the run ends."""
        shown = 0
        while True:
            with self._changed:
                while shown == len(self.lines) and self.ended is None:
                    self._changed.wait(1.0)
                new, done = self.lines[shown:], self.ended is not None
            for line in new:
                on_line(line)
            shown += len(new)
            if done and shown == len(self.lines):
                return

    def stop(self) -> None:
        self.stopped = True
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)


# batch.progress's status line: "3/10 objects (1 failed), 120 records, 55.0 records/s, ETA 0:04"
_PROGRESS = re.compile(r"(?P<done>\d+)/(?P<total>\d+) objects(?: \((?P<failed>\d+) failed\))?, "
                       r"(?P<records>\d+) records, (?P<rate>[\d.]+) records/s")
# and its last line: "tfservo transform: 9 of 10 objects transformed; 1 failed; 400 records in 2.0s (200.0 records/s)"
_SUMMARY_START = "tfservo transform: "
_SUMMARY = re.compile(r"(?P<done>\d+) of (?P<total>\d+) objects transformed(?:; \d+ already done)?"
                      r"(?:; (?P<failed>\d+) failed)?; (?P<records>\d+) records in [\d.]+s \((?P<rate>[\d.]+) records/s\)")


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with `extra` over it, TensorFlow's start-up noise off."""
    return environment.for_child(extra, quiet_native_env(environment.current()))
