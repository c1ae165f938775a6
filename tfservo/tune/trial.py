"""One trial of `tfservo tune`: a server started with one candidate's settings (through the
config file `serve --config` reads, so what is measured is what the written file will serve),
and a ladder of closed-loop runs at rising concurrency per protocol.

A ladder stops at the first level whose p99 passes the target, or once throughput stops
rising (the server is saturated: more clients only queue). The trial's score is its
throughput at the target: the best requests/s of a level whose p99 met it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tfservo.core import environment
from tfservo.core.settings import ConfigError
from tfservo.tune.load import GrpcTarget, HttpTarget, LoadResult, closed_loop
from tfservo.tune.workload import Workload

__all__ = ["Candidate", "Ladder", "ServerUnderTest", "measure_ladder", "warm", "write_config"]

LEVELS = (1, 2, 4, 8, 16, 32, 64, 128)
SATURATED_GAIN = 0.05  # a level adding less than this share of throughput: saturated
MIN_REQUESTS = 200  # what a level should hold for its p99 to mean something
MAX_STRETCH = 4  # at most this many --step per level


@dataclass(frozen=True)
class Candidate:
    """Settings to try: config-file keys (flag names, or variables for the batch sizes)."""

    settings: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Candidate:
        return cls(tuple(sorted(values.items())))

    @property
    def values(self) -> dict[str, Any]:
        return dict(self.settings)

    def label(self) -> str:
        v = self.values
        batching = str(v.get("batching", "auto"))
        if batching == "timeout":
            batching += f" {v.get('SAGEMAKER_TFS_MAX_BATCH_SIZE', '?')}/{v.get('SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS', '?')}µs"
        return f"workers {v.get('workers')}, threads {v.get('intra-op-threads')}, batching {batching}"


@dataclass
class Ladder:
    """One protocol's runs on one trial's server."""

    protocol: str
    runs: list[LoadResult] = field(default_factory=list)
    target_ms: float = 0.0

    @property
    def best(self) -> LoadResult | None:
        """The highest-throughput run whose p99 met the target (None: not even one client did)."""
        passing = [r for r in self.runs if r.errors == 0 and r.p99_ms <= self.target_ms]
        return max(passing, key=lambda r: r.rps, default=None)

    @property
    def rps_at_target(self) -> float:
        best = self.best
        return best.rps if best is not None else 0.0

    @property
    def concurrency_at_target(self) -> int:
        best = self.best
        return int(best.level) if best is not None else 0


def write_config(path: str, paths: list[str], values: Mapping[str, Any], header: str = "") -> None:
    """A TOML config file for `serve --config`: the bundle paths, then each setting."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines.append("paths = [" + ", ".join(json.dumps(p) for p in paths) + "]")
    for key, value in values.items():
        lines.append(f"{key} = {json.dumps(value)}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


class ServerUnderTest:
    """`tfservo serve --config FILE` on free loopback ports, stopped when the block ends."""

    last_start_s = 0.0  # how long the last server took to answer /ping (what a trial's start costs)

    def __init__(self, config: str, log_path: str, start_timeout: float = 300.0) -> None:
        self.config, self.log_path, self.start_timeout = config, log_path, start_timeout
        self.port = self.grpc_port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServerUnderTest:
        self.port, self.grpc_port = _free_port(), _free_port()
        command = [sys.executable, "-m", "tfservo", "serve", "--config", self.config,
                   "--host", "127.0.0.1", "--port", str(self.port), "--grpc-port", str(self.grpc_port)]
        log = open(self.log_path, "ab")
        env = environment.for_child({"PYTHONUNBUFFERED": "1"})
        self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        began = time.monotonic()
        deadline = began + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ConfigError(f"the server did not start (exit {self.proc.returncode}); its log: {self.log_path}:\n"
                                  + _tail(self.log_path))
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/ping", timeout=2) as r:
                    if r.status == 200:
                        ServerUnderTest.last_start_s = time.monotonic() - began
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.__exit__()
        raise ConfigError(f"the server did not answer /ping within {self.start_timeout:g} s; its log: {self.log_path}")

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
            return json.loads(r.read())

    def target(self, workload: Workload, protocol: str) -> HttpTarget | GrpcTarget:
        where, body, headers = workload.requests[protocol]
        if protocol == "grpc":
            return GrpcTarget("127.0.0.1", self.grpc_port, where, body)
        return HttpTarget("127.0.0.1", self.port, where, body, headers)

    def __exit__(self, *exc: object) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def measure_ladder(server: ServerUnderTest, workload: Workload, protocol: str, target_ms: float, step: float,
                   out_of_time: Callable[[], bool], progress: Callable[[str], None]) -> Ladder:
    """Closed-loop runs at LEVELS clients until p99 passes the target or throughput stops rising."""
    ladder = Ladder(protocol, target_ms=target_ms)
    target = server.target(workload, protocol)
    try:
        warm(target, step)
        flat = 0
        seconds = step
        for level in LEVELS:
            run = closed_loop(target, level, seconds)
            ladder.runs.append(run)
            progress(f"  {protocol:<11} {level:>4} clients  {run.rps:9.1f} req/s  p50 {run.p50_ms:8.2f} ms  "
                     f"p99 {run.p99_ms:8.2f} ms" + (f"  {run.errors} errors" if run.errors else ""))
            if run.errors or run.p99_ms > target_ms or out_of_time():
                break
            # a slow model's level runs longer, so its p99 and rate rest on MIN_REQUESTS at least
            seconds = min(MAX_STRETCH * step, max(step, MIN_REQUESTS / max(run.rps, 1e-9)))
            previous = ladder.runs[-2].rps if len(ladder.runs) > 1 else 0.0
            flat = flat + 1 if run.rps < previous * (1 + SATURATED_GAIN) else 0
            if flat >= 2:
                break
    finally:
        if isinstance(target, GrpcTarget):
            target.close()
    return ladder


def warm(target: HttpTarget | GrpcTarget, step: float, tries: int = 6) -> None:
    """Run one client until two runs in a row agree within 10 %: a fresh server's first seconds
    (kernels chosen, caches filled) are slower than it will be, and would count as noise."""
    last = 0.0
    for _ in range(tries):
        rps = closed_loop(target, 1, min(step, 1.0)).rps
        if last and abs(rps - last) <= 0.1 * max(rps, last):
            return
        last = rps


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""
