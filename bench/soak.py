"""The soak: `tfservo serve` on the SageMaker container's defaults (batching on, two workers)
under 64 closed-loop clients for a few minutes, with the server tree's memory sampled every
half second; then one 99 MB body through :predict and /invocations, timed, with each
worker's peak memory. Writes bench/results/soak.json; docs/reliability.md quotes it.

    .venv/bin/python bench/soak.py                  # 100 s per route (about 300k requests each on 2 cores)
    .venv/bin/python bench/soak.py --seconds 20     # a short run
    .venv/bin/python bench/soak.py --capture --seconds 600   # Data Capture at 100 % for 10 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

from load import post, run_wrk
from servers import TFSERVO, Server, free_port

ROOT = Path(__file__).resolve().parent.parent
TESTDATA = Path(os.environ.get("TFSERVO_TESTDATA", ROOT.parent / "shared" / "testdata"))
MODEL = TESTDATA / "sagemaker-tfs-container" / "resources" / "models" / "half_plus_three"


def tree_pids(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            parents[int(name)] = int(text[text.rindex(")") + 2 :].split()[1])
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(p for p, parent in parents.items() if parent == pid)
    return found


def rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M)[1]) * 1024
    except (OSError, TypeError):
        return 0


class MemoryTrace:
    """The resident memory of a process tree, sampled every `interval` seconds."""

    def __init__(self, root: int, interval: float = 0.5) -> None:
        self.root, self.interval = root, interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemoryTrace:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            total = sum(rss(p) for p in tree_pids(self.root))
            self.samples.append((round(time.monotonic() - self._start, 1), total))
            if self._stop.wait(self.interval):
                return

    def summary(self) -> dict[str, float]:
        values = [v for _, v in self.samples]
        tenth = max(1, len(values) // 10)
        return {
            "start_mb": round(values[0] / 2**20),
            "first_tenth_mean_mb": round(sum(values[:tenth]) / tenth / 2**20),
            "last_tenth_mean_mb": round(sum(values[-tenth:]) / tenth / 2**20),
            "max_mb": round(max(values) / 2**20),
        }


def soak(seconds: float, clients: int, log_dir: Path, work: Path) -> list[dict]:
    body = work / "soak.json"
    body.write_text('{"instances": [1.0, 2.0, 5.0]}')
    port = free_port()
    server = Server(
        name="tfservo soak", family="tfservo",
        command=[str(TFSERVO), "serve", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
                 "--grpc-port", "0", "--workers", "2", "--log-level", "warning"],
        ready_path="/ping", endpoints={}, port=port,
        env={"SAGEMAKER_TFS_ENABLE_BATCHING": "true"},  # the container's other batching defaults
    )
    rows = []
    server.start(log_dir)
    try:
        for route in ("/v1/models/half_plus_three:predict", "/invocations"):
            assert server.proc is not None
            with MemoryTrace(server.proc.pid) as trace:
                result = run_wrk(server.base_url + route, str(body), connections=clients, seconds=seconds,
                                 server_pid=server.proc.pid)
            rows.append({"route": route, "clients": clients, **result, "memory": trace.summary()})
            print(f"soak {route}: {result['requests']} requests, {result['errors']} not 200, "
                  f"p99 {result['p99_ms']} ms; memory {trace.summary()}", flush=True)
    finally:
        server.stop()
    return rows


def capture_soak(seconds: float, clients: int, log_dir: Path, work: Path) -> dict:
    """Data Capture at 100 % to a local folder (files published every 10 s) under load for
    `seconds`: the server tree's memory over time, and every answered request captured."""
    body = work / "soak.json"
    body.write_text('{"instances": [1.0, 2.0, 5.0]}')
    config = work / "capture.json"
    config.write_text(json.dumps({
        "EnableCapture": True, "InitialSamplingPercentage": 100, "DestinationS3Uri": str(work / "captured"),
        "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
        "CaptureContentTypeHeader": {"JsonContentTypes": ["application/json"]},
    }))
    port = free_port()
    server = Server(
        name="tfservo capture soak", family="tfservo",
        command=[str(TFSERVO), "serve", str(MODEL), "--host", "127.0.0.1", "--port", str(port), "--grpc-port", "0",
                 "--log-level", "warning", "--data-capture-config", str(config), "--data-capture-file-seconds", "10"],
        ready_path="/ping", endpoints={}, port=port,
    )
    server.start(log_dir)
    try:
        assert server.proc is not None
        with MemoryTrace(server.proc.pid, interval=2.0) as trace:
            result = run_wrk(server.base_url + "/invocations", str(body), connections=clients, seconds=seconds,
                             server_pid=server.proc.pid)
    finally:
        server.stop()
    files = sorted((work / "captured").rglob("*.jsonl"))
    lines = sum(1 for path in files for _ in open(path, "rb"))
    row = {"route": "/invocations", "clients": clients, "seconds": seconds, **result, "memory": trace.summary(),
           "captured_lines": lines, "capture_files": len(files)}
    print(f"capture soak: {result['requests']} requests, {lines} lines in {len(files)} files; "
          f"memory {trace.summary()}", flush=True)
    return row


def large_body(log_dir: Path) -> list[dict]:
    """One 99 MB numeric body, three times per route: the median time and the worker's peak."""
    body = b'{"instances": [' + b"0.123456789," * 9_000_000 + b"1]}"
    port = free_port()
    server = Server(
        name="tfservo large body", family="tfservo",
        command=[str(TFSERVO), "serve", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
                 "--grpc-port", "0", "--max-request-mb", "128", "--log-level", "warning"],
        ready_path="/ping", endpoints={}, port=port,
    )
    rows = []
    server.start(log_dir)
    try:
        assert server.proc is not None
        pid = server.proc.pid
        for route in ("/v1/models/half_plus_three:predict", "/invocations"):
            times, peaks = [], []
            for _ in range(3):
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")  # reset the high-water mark
                before = rss(pid)
                started = time.perf_counter()
                status, _ = post(server.base_url + route, body)
                times.append(time.perf_counter() - started)
                with open(f"/proc/{pid}/status") as f:
                    hwm = int(re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.M)[1]) * 1024
                peaks.append((hwm - before) / len(body))
                assert status == 200, status
            rows.append({"route": route, "body_mb": round(len(body) / 1e6, 1), "median_s": round(sorted(times)[1], 2),
                         "peak_over_body_median": round(sorted(peaks)[1], 2), "peak_over_body_max": round(max(peaks), 2)})
            print(f"99 MB body {route}: {rows[-1]}", flush=True)
    finally:
        server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=100.0, help="load time per route")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--out", default=None, help="[default: bench/results/soak.json, or capture_soak.json]")
    parser.add_argument("--capture", action="store_true",
                        help="instead: Data Capture at 100 %% under load for --seconds (issue 24: 600), memory traced")
    args = parser.parse_args()
    os.environ.setdefault("TFSERVO_TF_LOGS", "0")
    if args.capture:
        out = args.out or str(ROOT / "bench" / "results" / "capture_soak.json")
        with tempfile.TemporaryDirectory(prefix="tfservo-soak-") as tmp:
            row = capture_soak(args.seconds, args.clients, Path(tmp) / "logs", Path(tmp))
        doc = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{os.cpu_count()} cores",
               "capture_soak": row}
        Path(out).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"soak: wrote {out}")
        sys.exit(1 if row["errors"] else 0)
    args.out = args.out or str(ROOT / "bench" / "results" / "soak.json")
    with tempfile.TemporaryDirectory(prefix="tfservo-soak-") as tmp:
        work = Path(tmp)
        result = {
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{os.cpu_count()} cores",
            "soak": soak(args.seconds, args.clients, work / "logs", work),
            "large_body": large_body(work / "logs"),
        }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"soak: wrote {args.out}")
    failed = [r for r in result["soak"] if r["errors"]]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
