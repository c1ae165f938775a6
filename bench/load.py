"""Drive a server with wrk (pinned to its own core) and measure what the server used meanwhile."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import numpy as np
from procstat import CpuSample, cpu_use

LUA = Path(__file__).with_name("post.lua")
_RESULT = re.compile(r"^BENCH_RESULT (\{.*\})$", re.M)


def wrk_binary() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise SystemExit("bench: wrk is not installed; run bench/run (it installs Debian's wrk) or apt-get install wrk")
    return path


def load_core() -> int:
    """The core the load tool gets to itself: the last one."""
    return (os.cpu_count() or 1) - 1


def run_wrk(url: str, body: str, *, connections: int, seconds: float, server_pid: int,
            content_type: str = "application/json", timeout_s: int = 60, authorization: str | None = None) -> dict:
    """One fixed-duration closed-loop run: `connections` clients each POSTing `body` back to back."""
    command = [  # wrk takes whole seconds only: it refuses "-d6.66667s"
        "taskset", "-c", str(load_core()), wrk_binary(), "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
        f"--timeout={timeout_s}s", "-s", str(LUA), url,
    ]
    env = {**os.environ, "BENCH_BODY": body, "BENCH_CONTENT_TYPE": content_type}
    if authorization:
        env["BENCH_AUTHORIZATION"] = authorization
    before = CpuSample.take(server_pid)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    after = CpuSample.take(server_pid)
    match = _RESULT.search(out)
    if proc.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed (exit {proc.returncode}) on {url}:\n{out[-2000:]}")
    raw = json.loads(match.group(1))
    seconds_run = raw["duration_us"] / 1e6
    errors = {k: raw[k] for k in ("connect", "read", "write", "status", "timeout")}
    cpu = cpu_use(before, after)
    load_cores = (rusage.ru_utime + rusage.ru_stime) / max(after.wall - before.wall, 1e-9)
    return {
        "requests": raw["requests"],
        "seconds": round(seconds_run, 3),
        "rps": round(raw["requests"] / seconds_run, 2),
        "p50_ms": raw["p50_us"] / 1e3,
        "p90_ms": raw["p90_us"] / 1e3,
        "p99_ms": raw["p99_us"] / 1e3,
        "mean_ms": round(raw["mean_us"] / 1e3, 3),
        "max_ms": raw["max_us"] / 1e3,
        "errors": sum(errors.values()),
        "error_kinds": {k: v for k, v in errors.items() if v},
        "server_cores": cpu["server_cores"],
        "load_tool_cores": round(load_cores, 3),
        # Whatever else ran on the machine meanwhile (other processes than server and wrk).
        "other_cores": round(max(cpu["machine_cores"] - cpu["server_cores"] - load_cores, 0.0), 3),
    }


def post(url: str, body: bytes, content_type: str = "application/json", timeout: float = 120) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def first_output(protocol: str, body: bytes) -> np.ndarray:
    """The first row of the first output, from a TF Serving or KServe V2 JSON answer."""
    doc = json.loads(body)
    if protocol == "v2":
        return np.asarray(doc["outputs"][0]["data"], dtype=np.float64).ravel()
    preds = doc["predictions"]
    first = preds[0]
    if isinstance(first, dict):
        first = next(iter(first.values()))
    return np.asarray(first, dtype=np.float64).ravel()
