"""This checkout against a baseline commit, back to back on one machine: the MLP over HTTP at
32 clients (defaults, and batching with 2 workers) and one client, for issue 21's "no slower".

    .venv/bin/python bench/compare_commits.py WORK RESULTS [--baseline COMMIT] [--seconds S]
        [--name NAME] [--why TEXT]

Both commits run from this checkout's .venv (the baseline's code first on PYTHONPATH, from a git
worktree under WORK); wrk runs on CPU 1 (taskset), interleaved baseline/this, best of 2.
Writes RESULTS/NAME.json (compare_commits.json by default) in the report's section format, its
title led by WHY (the change it measures).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
RESULT = re.compile(r"BENCH_RESULT (\{.*\})")
CONFIGS = {
    "defaults": ({}, 1),
    "batching, 2 workers": ({"SAGEMAKER_TFS_ENABLE_BATCHING": "true", "SAGEMAKER_TFS_MAX_BATCH_SIZE": "32",
                             "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": "1000", "SAGEMAKER_TFS_NUM_BATCH_THREADS": "2"}, 2),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(source: Path, model: Path, env: dict[str, str], workers: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [str(PYTHON), "-m", "tfservo", "serve", str(model), "--port", str(port), "--grpc-port", "0",
         "--workers", str(workers), "--log-level", "warning"],
        env={**os.environ, **env, "PYTHONPATH": str(source), "TF_CPP_MIN_LOG_LEVEL": "3"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as answer:
                if answer.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"tfservo at {source} did not start")


def wrk(port: int, body: Path, clients: int, seconds: float) -> dict:
    done = subprocess.run(
        ["taskset", "-c", "1", "wrk", "-t1", f"-c{clients}", f"-d{int(seconds)}s", "-s", str(REPO / "bench" / "post.lua"),
         f"http://127.0.0.1:{port}/v1/models/mlp:predict"],
        env={**os.environ, "BENCH_BODY": str(body)}, capture_output=True, text=True, check=True,
    )
    found = RESULT.search(done.stdout)
    assert found, done.stdout
    doc = json.loads(found[1])
    doc["rps"] = doc["requests"] / (doc["duration_us"] / 1e6)
    return doc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work", type=Path)
    parser.add_argument("results", type=Path)
    parser.add_argument("--baseline", default="3339c38")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--name", default="compare_commits", help="the results file's name, without .json")
    parser.add_argument("--why", default="Issue 21 (packages by role)", help="what the comparison measures")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    args.work = args.work.resolve()
    if not (args.work / "models" / "mlp" / "1").is_dir():
        subprocess.run([str(PYTHON), str(REPO / "bench" / "models.py"), str(args.work)], check=True,
                       capture_output=True)
    sys.path.insert(0, str(REPO / "bench"))
    from insurance_bench import baseline_checkout
    from models import mlp_instance

    body = args.work / "mlp-1.json"
    body.write_text(json.dumps({"instances": [mlp_instance()]}))
    sources = {"baseline": baseline_checkout(args.work, args.baseline), "this": REPO}
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    best: dict[tuple[str, str, int], dict] = {}
    for _ in range(2):
        for config, (env, workers) in CONFIGS.items():
            for name, source in sources.items():
                proc, port = serve(source, args.work / "models" / "mlp", env, workers)
                try:
                    wrk(port, body, 8, 2)  # warm up
                    for clients in (32, 1):
                        got = wrk(port, body, clients, args.seconds)
                        key = (config, name, clients)
                        if key not in best or got["rps"] > best[key]["rps"]:
                            best[key] = got
                finally:
                    os.killpg(proc.pid, 15)
                    proc.wait(timeout=30)
    rows = []
    for config in CONFIGS:
        for clients in (32, 1):
            base, this = best[(config, "baseline", clients)], best[(config, "this", clients)]
            rows.append({
                "MLP :predict": f"{config}, {clients} client{'s' if clients > 1 else ''}",
                f"req/s at {args.baseline}": round(base["rps"]), f"req/s at {commit}": round(this["rps"]),
                "× baseline": f"{this['rps'] / base['rps']:.2f}×",
                f"p50 ms at {args.baseline}": f"{base['p50_us'] / 1000:.2f}", f"p50 ms at {commit}": f"{this['p50_us'] / 1000:.2f}",
            })
    doc = {
        "title": f"{args.why}: this checkout ({commit}) against {args.baseline}, same run",
        "rows": rows,
        "notes": [f"wrk -t1 on CPU 1, {args.seconds:g} s per run, best of 2 interleaved runs; both commits from "
                  "this checkout's .venv; TF Serving JSON, one 784-float instance per request."],
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{args.name}.json").write_text(json.dumps(doc, indent=2))
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
