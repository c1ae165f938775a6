"""Ray Serve against `tfservo serve` on the same cores (issue 64): the same bundle, the same
settings (one worker or one replica, TensorFlow threads on both cores, adaptive batching), the
same requests, closed loop at 1 and 8 clients from tfservo's load generator, rounds
alternated so drift hits both. Ray Serve runs on a one-node local cluster in this process's
machine: its HTTP proxy and the replica are separate processes, which is the hop it adds.

Targets: ResNet-50 (its JPEG through the bundle's handler at /invocations) ≥ 0.8× tfservo
serve's throughput; the MLP (TF Serving JSON) reported.

Writes RESULTS/ray_serve.json in the report's section format.

Usage: python bench/ray_serve_bench.py WORKDIR RESULTS [--quick]
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Any

from models import build_all
from report import save_section, section_arguments

from tfservo.core.memory import usable_cores
from tfservo.tune.load import HttpTarget, closed_loop
from tfservo.tune.trial import ServerUnderTest, write_config

SETTINGS = {"workers": 1, "intra-op-threads": 2, "batching": "auto"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/ping", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer /ping")


def measure(name: str, bundle: str, path: str, body: bytes, headers: dict[str, str], seconds: float,
            rounds: int, out: Path) -> dict[str, Any]:
    import ray
    from ray import serve

    from tfservo.ray_serve import ReplicaOptions, build_app

    config = str(out / f"{name}.toml")
    write_config(config, [bundle], SETTINGS)
    ray_port = free_port()
    ray.init(num_cpus=usable_cores(), include_dashboard=False, logging_level="ERROR")
    serve.start(http_options={"host": "127.0.0.1", "port": ray_port})
    serve.run(build_app(config=config, options=ReplicaOptions(num_cpus=usable_cores())), name="tfservo",
              route_prefix="/")
    wait_ready(f"http://127.0.0.1:{ray_port}")
    results: dict[str, dict[int, list[tuple[float, float]]]] = {"serve": {}, "ray": {}}
    try:
        with ServerUnderTest(config, str(out / f"{name}-serve.log")) as server:
            targets = {"serve": HttpTarget("127.0.0.1", server.port, path, body, headers),
                       "ray": HttpTarget("127.0.0.1", ray_port, path, body, headers)}
            for target in targets.values():
                closed_loop(target, 4, seconds)  # warm both
            for i in range(rounds):
                for clients in (1, 8):
                    for who in (("serve", "ray") if i % 2 == 0 else ("ray", "serve")):
                        run = closed_loop(targets[who], clients, seconds)
                        assert run.errors == 0, (who, clients, run.errors)
                        results[who].setdefault(clients, []).append((run.rps, run.p50_ms))
    finally:
        serve.shutdown()
        ray.shutdown()
    rows = []
    for clients in (1, 8):
        serve_rps = statistics.median(r for r, _ in results["serve"][clients])
        ray_rps = statistics.median(r for r, _ in results["ray"][clients])
        ratios = [a[0] / b[0] for a, b in zip(results["ray"][clients], results["serve"][clients], strict=True)]
        rows.append({
            "model": name, "clients": clients,
            "tfservo serve req/s": round(serve_rps, 1), "Ray Serve req/s": round(ray_rps, 1),
            "Ray / serve": f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})",
            "p50 ms serve / Ray": f"{statistics.median(p for _, p in results['serve'][clients]):.2f} / "
                                  f"{statistics.median(p for _, p in results['ray'][clients]):.2f}",
        })
    return {"rows": rows, "raw": results}


def main() -> None:
    args = section_arguments()
    paths = build_all(args.workdir)
    out = Path(args.workdir) / "ray_serve"
    out.mkdir(parents=True, exist_ok=True)
    seconds, rounds = (2.0, 2) if args.quick else (4.0, 4)
    mlp_body = Path(paths["body:mlp.tfs.json"]).read_bytes()
    jpeg_body = Path(paths["body:resnet_b64.tfs.json"]).read_bytes()
    runs = [
        measure("MLP", paths["mlp"], "/v1/models/mlp:predict", mlp_body, {"Content-Type": "application/json"},
                seconds, rounds, out),
        measure("ResNet-50", paths["resnet50"], "/invocations", jpeg_body, {"Content-Type": "application/json"},
                seconds * 2, rounds, out),
    ]
    save_section(args.results, "ray_serve", {
        "title": "Ray Serve against tfservo serve on the same cores (issue 64)",
        "rows": [row for run in runs for row in run["rows"]],
        "notes": [
            "Target: ResNet-50 ≥ 0.8× tfservo serve; the MLP reported. Both: one worker / one replica, "
            f"TF threads on both cores, adaptive batching; {rounds} rounds alternated, medians and the rounds' range.",
            "Ray Serve adds its HTTP proxy, a separate process, in front of the replica; the load generator "
            f"shares this machine's {usable_cores()} cores with both.",
        ],
        "raw": [run["raw"] for run in runs],
    })
    print(json.dumps([run["rows"] for run in runs], indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
