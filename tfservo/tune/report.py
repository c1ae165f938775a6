"""What `tfservo tune` writes: the table of every trial, `tune.json` (every run), `tune.png`
(p99 against throughput per trial, with the target), the chosen settings as `tuned.toml` for
`serve --config`, and the capacity: concurrency and sustained rate per instance, instances for
a rate, and the scaling rules (tfservo.tune.scaling)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

from tfservo.tune.scaling import ScalingTargets, hpa_yaml, instances_for, keda_yaml, sagemaker_policy
from tfservo.tune.search import TuneResult
from tfservo.tune.trial import write_config
from tfservo.tune.workload import PROTOCOLS

__all__ = ["summary_lines", "table_lines", "write_outputs"]


def table_lines(result: TuneResult) -> list[str]:
    """One row per trial and protocol: throughput at the target, and p50/p99 at that load."""
    p99 = result.options.p99_ms
    header = f"{'#':>2}  {'settings':<52} {'protocol':<11} {'req/s at p99≤' + format(p99, 'g') + 'ms':>17} " \
             f"{'clients':>7} {'p50 ms':>8} {'p99 ms':>8}"
    lines = [header, "-" * len(header)]
    for i, trial in enumerate(result.trials, 1):
        for protocol, ladder in trial.ladders.items():
            best = ladder.best
            mark = " *" if trial is result.best and protocol == trial.protocol else ""
            if best is None:
                row = f"{'—':>17} {'—':>7} {'—':>8} {'—':>8}"
            else:
                row = f"{best.rps:17.1f} {int(best.level):7d} {best.p50_ms:8.2f} {best.p99_ms:8.2f}"
            lines.append(f"{i:>2}  {trial.candidate.label():<52} {protocol:<11} {row}{mark}")
    return lines


def summary_lines(result: TuneResult, rate: float | None) -> list[str]:
    best = result.best
    o = result.options
    lines = [
        f"requests: {result.workload.source}",
        f"measured {len(result.trials)} settings in {result.seconds:.0f} s of a {o.budget_s:.0f} s budget "
        f"on {result.cores} cores; the search stopped because {result.stopped}",
        f"noise: {result.noise * 100:.1f} % (gains under it are not kept; results repeat within it)",
    ]
    if best is None or best.rps <= 0:
        lines.append(f"no setting met p99 ≤ {o.p99_ms:g} ms even at 1 client: the target is below one request's latency")
        return lines
    sustained = result.sustained_rps
    lines += [
        f"chosen (*): {best.candidate.label()}, {PROTOCOLS[best.protocol]}",
        f"per instance at p99 ≤ {o.p99_ms:g} ms: {best.concurrency} requests in flight, {best.rps:.1f} req/s closed loop, "
        + (f"{sustained:.1f} req/s open loop (Poisson arrivals)" if sustained else "no open-loop rate met the target"),
    ]
    if result.generator_bound:
        lines.append("the load generator sent open-loop requests late (it shares this machine's cores with the "
                     "server): the open-loop rate is a lower bound of what an instance sustains")
    per_instance = sustained or best.rps
    if rate:
        lines.append(f"for {rate:g} req/s: {instances_for(rate, per_instance)} instances "
                     f"({per_instance:.1f} req/s each)")
    return lines


def write_outputs(result: TuneResult, emit: tuple[str, ...], rate: float | None) -> dict[str, str]:
    """Write tuned.toml, tune.json, tune.png (when matplotlib is there) and what `emit` asks
    for (`k8s`, `sagemaker`); returns what → path."""
    o = result.options
    written: dict[str, str] = {}
    best = result.best
    if best is not None and best.rps > 0:
        path = os.path.join(o.out_dir, "tuned.toml")
        header = (f"tfservo tune {o.bundle} --p99 {o.p99_ms:g}ms: {best.rps:.1f} req/s at {best.concurrency} "
                  f"requests in flight over {best.protocol}\nserve it with: tfservo serve --config {path}")
        write_config(path, [o.bundle], best.candidate.values, header)
        written["config"] = path
    path = os.path.join(o.out_dir, "tune.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_document(result, rate), f, indent=2)
    written["results"] = path
    plot = _plot(result)
    if plot:
        written["plot"] = plot
    per_instance = (result.sustained_rps or best.rps) if best is not None else 0.0
    if "k8s" in emit and best is not None and best.concurrency:
        folder = os.path.join(o.out_dir, "k8s")
        os.makedirs(folder, exist_ok=True)
        targets = ScalingTargets(
            concurrency=best.concurrency,
            max_replicas=max(10, instances_for(rate, per_instance) * 2) if rate and per_instance else 10,
            source=f"tfservo tune: p99 ≤ {o.p99_ms:g} ms at {best.concurrency} in flight",
        )
        for name, text in (("keda-scaledobject.yaml", keda_yaml(targets)), ("hpa.yaml", hpa_yaml(targets))):
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                f.write(text)
        written["k8s"] = folder
    if "sagemaker" in emit and per_instance > 0:
        path = os.path.join(o.out_dir, "sagemaker-autoscaling.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(sagemaker_policy(per_instance))
        written["sagemaker"] = path
    return written


def _document(result: TuneResult, rate: float | None) -> dict[str, object]:
    best = result.best
    return {
        "options": asdict(result.options),
        "requests": result.workload.source,
        "cores": result.cores,
        "noise": result.noise,
        "seconds": round(result.seconds, 1),
        "stopped": result.stopped,
        "trials": [
            {"settings": trial.candidate.values, "seconds": round(trial.seconds, 1), "protocol": trial.protocol,
             "rps_at_target": round(trial.rps, 2), "concurrency_at_target": trial.concurrency,
             "ladders": {p: [r.summary() for r in ladder.runs] for p, ladder in trial.ladders.items()}}
            for trial in result.trials
        ],
        "chosen": None if best is None else {
            "settings": best.candidate.values, "protocol": best.protocol, "rps_at_target": round(best.rps, 2),
            "concurrency_at_target": best.concurrency, "sustained_rps": round(result.sustained_rps, 2),
            "open_loop": [r.summary() for r in result.open_runs],
            "instances_for_rate": (instances_for(rate, result.sustained_rps or best.rps)
                                   if rate and (result.sustained_rps or best.rps) else None),
        },
    }


def _plot(result: TuneResult) -> str | None:
    """p99 latency against throughput for each trial's ladder, with the target as a line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, trial in enumerate(result.trials, 1):
        for protocol, ladder in trial.ladders.items():
            runs = [r for r in ladder.runs if len(r.latencies)]
            if not runs:
                continue
            chosen = trial is result.best and protocol == trial.protocol
            ax.plot([r.rps for r in runs], [r.p99_ms for r in runs], marker="o", linewidth=2.5 if chosen else 1,
                    label=f"{i}: {trial.candidate.label()} · {protocol}" + (" (chosen)" if chosen else ""))
    ax.axhline(result.options.p99_ms, color="red", linestyle="--", label=f"target p99 {result.options.p99_ms:g} ms")
    ax.set_xlabel("throughput (requests/s, closed loop)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_yscale("log")
    ax.set_title(f"tfservo tune {os.path.basename(result.options.bundle.rstrip('/'))}")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = os.path.join(result.options.out_dir, "tune.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
