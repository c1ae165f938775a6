"""What the supervisor costs and what it buys: `tfservo serve` with its default supervisor and
with --no-supervisor, each started N times — seconds from launch to the first answered
/ping, and the resident memory of the whole process tree once serving — and, supervised, the
seconds from a SIGKILL of the worker to the next answered request. Writes
bench/results/supervision.json; docs/reliability.md quotes it.

    .venv/bin/python bench/supervision.py            # 5 starts each
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

from servers import TFSERVO, free_port
from soak import MODEL, rss, tree_pids

ROOT = Path(__file__).resolve().parent.parent
_PID = re.compile(rb"pid (\d+) of 1 workers")


def _answered(url: str, deadline: float) -> float:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic()
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{url} never answered")


def one_start(supervised: bool, log: Path) -> dict[str, float]:
    port = free_port()
    command = [TFSERVO, "serve", str(MODEL), "--port", str(port), "--grpc-port", "0"]
    if not supervised:
        command.append("--no-supervisor")
    with open(log, "wb") as out:
        started = time.monotonic()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            ready = _answered(f"http://127.0.0.1:{port}/ping", started + 240) - started
            time.sleep(1)
            result = {"start_s": ready, "tree_mb": sum(rss(p) for p in tree_pids(proc.pid)) / 2**20}
            if supervised:
                worker = int(_PID.search(log.read_bytes())[1])
                result["supervisor_mb"] = (result["tree_mb"] - rss(worker) / 2**20)
                killed = time.monotonic()
                os.kill(worker, signal.SIGKILL)
                result["replaced_s"] = _answered(f"http://127.0.0.1:{port}/ping", killed + 240) - killed
            return result
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    logs = ROOT / "bench" / "work" / "supervision"
    logs.mkdir(parents=True, exist_ok=True)
    report: dict[str, object] = {"model": MODEL.name, "runs": args.runs, "machine": f"{os.cpu_count()} cores"}
    for supervised in (True, False):
        key = "supervised" if supervised else "no_supervisor"
        runs = [one_start(supervised, logs / f"{key}-{i}.log") for i in range(args.runs)]
        report[key] = {name: round(statistics.median(r[name] for r in runs), 2) for name in runs[0]}
        print(key, report[key], flush=True)
    out = ROOT / "bench" / "results" / "supervision.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
