"""Run a real `tfservo serve` process on loopback for tests, and talk HTTP to it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from tfservo.server.run import READY_LINE

REPO = Path(__file__).resolve().parent.parent
TFSERVO = str(REPO / ".venv" / "bin" / "tfservo") if (REPO / ".venv" / "bin" / "tfservo").exists() else "tfservo"
_GRPC = re.compile(r"gRPC(?: \(TLS\))? on (?P<host>[^:]+):(?P<port>\d+)")
# The serving line's workers: "pid 12", "pids 12, 13" (a supervisor's, once all serve), then
# "replacement pid 14" for each worker started in a dead or recycled one's place.
_PIDS = re.compile(r"serving .*?\b(?:replacement pid|pids?) ([\d, ]+) of \d+ workers")


def serving_pids(lines: list[str]) -> list[int]:
    """The pids of the workers the server's serving lines name, in the order they served."""
    return [int(pid) for line in lines if (m := _PIDS.search(line)) for pid in m[1].split(", ")]


class ServerProcess:
    """A `tfservo serve` child process; `url` is its base URL once started. One worker unless
    the test asks for more (`--workers`, SAGEMAKER_GUNICORN_WORKERS): the default, one per core
    for the small models tests use, would double every server's start on the suite's 2 cores
    for tests that are not about workers (those about the default count test `auto_workers`)."""

    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        timeout: float = 120.0,
        file_limit: int | None = None,
        tfservo: str = TFSERVO,
    ) -> None:
        self.file_limit = file_limit  # RLIMIT_NOFILE of the server process
        self.args = [tfservo, "serve", "--host", "127.0.0.1", "--port", "0", *args]
        if "--grpc-port" not in args:
            self.args += ["--grpc-port", "0"]
        self.env = {**os.environ, **(env or {})}
        if "--workers" not in args and "SAGEMAKER_GUNICORN_WORKERS" not in (env or {}):
            self.env["SAGEMAKER_GUNICORN_WORKERS"] = "1"
        self.timeout = timeout
        self.lines: list[str] = []
        self.url = ""
        self.grpc_target = ""
        self.proc: subprocess.Popen | None = None
        self._ready = threading.Event()

    def start(self) -> ServerProcess:
        self.proc = subprocess.Popen(
            set_up(self.args, file_limit=self.file_limit) if self.file_limit else self.args,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + self.timeout
        while not self._ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"tfservo serve did not start (exit {self.proc.returncode}):\n" + self.output
                )
        return self

    def _drain(self) -> None:
        assert self.proc and self.proc.stderr
        for line in self.proc.stderr:
            self.lines.append(line)
            if m := _GRPC.search(line):
                self.grpc_target = f"{m['host']}:{m['port']}"
            if m := READY_LINE.search(line):
                self.url = f"{m['scheme']}://{m['host']}:{m['port']}"
                self._ready.set()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 15) -> str:
        """The output once it holds `text` (a line logged after the answer was sent may come a
        moment later), or the output so far after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while text not in (output := self.output) and time.monotonic() < deadline:
            time.sleep(0.05)
        return output

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kw)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def descendants(self) -> list[int]:
        """Pids of the server's processes below the one started (its workers and theirs), from /proc."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        found, todo = [], [self.proc.pid] if self.proc is not None else []
        while todo:
            for child in children.get(todo.pop(), []):
                found.append(child)
                todo.append(child)
        return found

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def run_cli(args: Sequence[str], input: bytes | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess:
    """Run `tfservo ARGS` to completion and capture its output."""
    return subprocess.run(
        [TFSERVO, *args], input=input, capture_output=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )


# One tfservo command line in a fresh interpreter, then a last line saying how it ended: its exit
# code, whether TensorFlow was imported, its pid.
_OBSERVED = """
import json, os, sys
from tfservo.cli.commands import main
code = 0
try:
    main(sys.argv[1:], prog_name="tfservo", standalone_mode=True)
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
print("\\nOBSERVED " + json.dumps({"code": code, "tensorflow": "tensorflow" in sys.modules, "pid": os.getpid()}))
"""


def run_observed(args: Sequence[str], input: bytes = b"", cwd: str | os.PathLike[str] | None = None,
                 timeout: float = 300) -> tuple[str, str, dict]:
    """Run `tfservo ARGS` in a fresh interpreter: (its stdout, its stderr, {code, tensorflow, pid})."""
    done = subprocess.run([sys.executable, "-c", _OBSERVED, *args], input=input, capture_output=True,
                          timeout=timeout, cwd=cwd)
    out, _, outcome = done.stdout.decode().rpartition("\nOBSERVED ")
    return out.strip(), done.stderr.decode(), json.loads(outcome)


__all__ = ["ServerProcess", "run_cli", "run_observed"]


def answers_ping(base_url: str, proc: subprocess.Popen, timeout: float) -> bool:
    """Wait until GET /ping answers 200; False when `proc` exits or `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/ping", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    return False


_SET_UP_AND_EXEC = """
import os, resource, signal, sys
limit, ctrl_c, command = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:]
if limit:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
if ctrl_c:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execvp(command[0], command)
"""


def set_up(command: list[str], *, file_limit: int | None = None, ctrl_c: bool = False) -> list[str]:
    """`command`, started by a small Python that first sets its file limit and/or SIGINT's
    default action and then execs it.

    ctrl_c: for a child the test stops with SIGINT, the default action a terminal gives; a child
    inherits an ignored SIGINT under xdist (and neither Python nor bash will then catch it). Not
    a preexec_fn: that makes Popen fork() instead of vfork(), and under grpcio 1.80+ the forked
    child of a test process with live gRPC channels can abort before its exec (grpc/grpc#43055;
    seen here as "epoll_wait error: Bad file descriptor", exit -6, twice in full runs)."""
    return [sys.executable, "-S", "-c", _SET_UP_AND_EXEC, str(file_limit or 0), "1" if ctrl_c else "0", *command]
