"""`tfservo tune` against an exhaustive sweep (issue 64), on the MLP and ResNet-50 bundles.

The sweep measures every combination of the settings tune searches (workers × TensorFlow
threads × batching, each server with every protocol the workload has) with the same ladder
tune uses (tfservo.tune.trial.measure_ladder), and keeps the best throughput at the latency
target. `tfservo tune` then runs with a budget of a quarter of the sweep's time. Targets: its
pick within 5 % of the sweep's best, found in at most a quarter of the sweep's time.

Both picks come from separate runs on a shared machine, so they are then measured side by side
(a fresh server each, alternated for `ROUNDS` rounds at each pick's own concurrency): the ratio
reported is the median of the paired rounds, tune's pick / the sweep's best.

The MLP gets generated rows (TF Serving JSON, V2 binary, gRPC; p99 ≤ 20 ms); ResNet-50 the
bench's JPEG request through its handler at /invocations (p99 ≤ 1 s).

Writes RESULTS/tune.json in the report's section format.

Usage: python bench/tune_bench.py WORKDIR RESULTS [--quick]
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from models import build_all
from report import save_section, section_arguments

from tfservo.core.memory import usable_cores
from tfservo.tune.load import closed_loop
from tfservo.tune.search import TuneOptions, baseline, dimensions, tune, with_change
from tfservo.tune.trial import Candidate, ServerUnderTest, measure_ladder, write_config
from tfservo.tune.workload import generated_workload, invocations_workload

ROUNDS = 3


def every_candidate(bundle: str, cores: int) -> list[Candidate]:
    """The cartesian product of every value each of tune's dimensions offers."""
    start = baseline(bundle, cores)
    dims = dimensions(cores, 0)
    worker_changes = dims[0][1](start.values)
    out: list[Candidate] = []
    for w in worker_changes:
        with_workers = with_change(start, w)
        thread_changes = dims[1][1](with_workers.values)
        batch_changes = dims[2][1](with_workers.values)
        for t, b in itertools.product(thread_changes, batch_changes):
            out.append(with_change(with_change(with_workers, t), b))
    return list(dict.fromkeys(out))


def sweep(bundle: str, p99_ms: float, step: float, requests: tuple[str, str] | None, out: Path) -> dict[str, Any]:
    cores = usable_cores()
    started = time.monotonic()
    log = str(out / "sweep-servers.log")
    config = str(out / "sweep.toml")
    workload = None
    rows = []
    for candidate in every_candidate(bundle, cores):
        write_config(config, [bundle], candidate.values)
        with ServerUnderTest(config, log) as server:
            if workload is None:
                workload = (invocations_workload(requests[0], requests[1], None) if requests else
                            generated_workload(server.get_json(f"/v2/models/{Path(bundle).name}"), 1))
            for protocol in workload.protocols:
                ladder = measure_ladder(server, workload, protocol, p99_ms, step, lambda: False, print)
                rows.append({"settings": candidate.values, "label": candidate.label(), "protocol": protocol,
                             "rps": ladder.rps_at_target, "concurrency": ladder.concurrency_at_target})
                print(f"sweep {candidate.label()} {protocol}: {ladder.rps_at_target:.1f} req/s", flush=True)
    best = max(rows, key=lambda r: r["rps"])
    return {"seconds": time.monotonic() - started, "trials": rows, "best": best, "workload": workload}


def side_by_side(bundle: str, picks: dict[str, dict[str, Any]], workload: Any, step: float, out: Path) -> dict[str, list[float]]:
    """Each pick on a fresh server at its own concurrency, alternated for ROUNDS rounds."""
    rps: dict[str, list[float]] = {name: [] for name in picks}
    for _ in range(ROUNDS):
        for name, pick in picks.items():
            config = str(out / f"{name}.toml")
            write_config(config, [bundle], pick["settings"])
            with ServerUnderTest(config, str(out / "pairs-servers.log")) as server:
                target = server.target(workload, pick["protocol"])
                closed_loop(target, max(1, pick["concurrency"]), step)  # warm
                run = closed_loop(target, max(1, pick["concurrency"]), step * 2)
                rps[name].append(run.rps)
                close = getattr(target, "close", None)
                if close:
                    close()
    return rps


def bench_one(name: str, bundle: str, p99_ms: float, step: float, requests: tuple[str, str] | None,
              out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    swept = sweep(bundle, p99_ms, step, requests, out)
    budget = swept["seconds"] / 4
    options = TuneOptions(bundle=bundle, p99_ms=p99_ms, budget_s=budget, out_dir=str(out / "tune"),
                          requests_file=requests[0] if requests else None,
                          content_type=requests[1] if requests else "application/json", step_s=step)
    t0 = time.monotonic()
    result = tune(options, lambda line: print("tune", line, flush=True))
    tune_seconds = time.monotonic() - t0
    assert result.best is not None
    tuned = {"settings": result.best.candidate.values, "protocol": result.best.protocol,
             "concurrency": result.best.concurrency, "rps": result.best.rps}
    pairs = side_by_side(bundle, {"tune": tuned, "sweep": swept["best"]}, swept["workload"], step, out)
    ratios = [t / s for t, s in zip(pairs["tune"], pairs["sweep"], strict=True) if s > 0]
    return {
        "model": name, "p99_ms": p99_ms, "sweep_seconds": round(swept["seconds"], 1),
        "sweep_settings": len(swept["trials"]), "sweep_best": swept["best"],
        "tune_seconds": round(tune_seconds, 1), "tune_budget": round(budget, 1), "tune_trials": len(result.trials),
        "tune_pick": tuned, "tune_noise": result.noise, "pairs": pairs,
        "ratio": statistics.median(ratios) if ratios else 0.0,
        "time_share": tune_seconds / swept["seconds"],
    }


def main() -> None:
    args = section_arguments()
    paths = build_all(args.workdir)
    out = Path(args.workdir) / "tune"
    step = 0.5 if args.quick else 1.0
    jpeg_body = Path(paths["body:resnet_b64.tfs.json"])
    only = os.environ.get("TUNE_BENCH_ONLY")  # "MLP" or "ResNet-50": rerun one, keep the other's last result
    kept = ([r for r in json.loads(Path(args.results, "tune.json").read_text())["runs"] if r["model"] != only]
            if only and Path(args.results, "tune.json").exists() else [])
    runs = [] if only == "ResNet-50" else [bench_one("MLP", paths["mlp"], 20.0, step, None, out / "mlp")]
    if not args.quick and only != "MLP":
        runs.append(bench_one("ResNet-50", paths["resnet50"], 1000.0, step, (str(jpeg_body), "application/json"),
                              out / "resnet50"))
    runs = sorted(kept + runs, key=lambda r: r["model"] != "MLP")
    rows = [{
        "model": r["model"], "p99 target": f"{r['p99_ms']:g} ms",
        "sweep: settings, time": f"{r['sweep_settings']}, {r['sweep_seconds']:.0f} s",
        "sweep's best": f"{r['sweep_best']['label']}, {r['sweep_best']['protocol']}: {r['sweep_best']['rps']:.0f} req/s",
        "tune: trials, time": f"{r['tune_trials']}, {r['tune_seconds']:.0f} s ({r['time_share']:.2f}× the sweep's)",
        "tune's pick": f"{r['tune_pick']['settings']}, {r['tune_pick']['protocol']}: {r['tune_pick']['rps']:.0f} req/s",
        "pick / best, side by side": f"{r['ratio']:.2f}× (rounds: "
        + ", ".join(f"{t:.0f}/{s:.0f}" for t, s in zip(r["pairs"]["tune"], r["pairs"]["sweep"], strict=True)) + ")",
    } for r in runs]
    save_section(args.results, "tune", {
        "title": "tfservo tune against an exhaustive sweep (issue 64)",
        "rows": rows,
        "notes": [
            "Targets: tune's pick ≥ 0.95× the sweep's best throughput at the p99 target, in ≤ 0.25× the sweep's time.",
            "The sweep and tune use the same ladder (tfservo.tune.trial); the load generator shares this "
            f"machine's {usable_cores()} cores with the server. The ratio is the median of {ROUNDS} paired rounds "
            "on fresh servers, each pick at its own concurrency.",
        ],
        "runs": runs,
    })
    print(json.dumps([{k: v for k, v in r.items() if k != "pairs"} for r in runs], indent=1, default=str))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
