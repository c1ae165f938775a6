"""Issue 28's serving targets measured side by side. The MLP: tfservo's defaults, the HTTP floor
(the do-nothing app on uvicorn + httptools) and PyTriton at 32 clients, and the defaults and
batching off (one worker) at one client; beside them, at both, the least server
(bench/least_server.py: the work alone on the floor's stack), whose figures the notes give for
reference: what tfservo's own layers cost, and what the work costs over the floor. ResNet-50: the defaults and PyTriton on both bodies at
8 clients, and the in-process call at batch 8 (the faster of the session callable and the TF2
signature, each in a process of its own). A model's servers run at once and are driven in
turns, round after round, the order rotated each round. Each target's ratio is taken within a
round, where drift on a shared machine hits both sides alike, and its figure is the median over
the rounds, with the lowest and highest round beside it. The serving tables run each server
once, minutes apart; on this project's machine a server's figure moves by ±20 % between such
runs, and a ratio of two of them by more.

Writes RESULTS/targets.json in the report's section format.

Usage: python bench/targets_bench.py WORKDIR RESULTS [--quick]
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import servers
from ceiling import measure_alone
from load import run_wrk
from models import build_all
from report import save_section, section_arguments, verdict, verdict_against
from serving import BATCHING, check_answer, cpu

DEFAULTS, FLOOR, PYTRITON, OFF = "tfservo defaults", "HTTP floor", "PyTriton", "tfservo batching off, 1 worker"
LEAST = "least server"  # bench/least_server.py: the work alone, on the floor's stack
IN_PROCESS = "in-process call, batch 8"
IN_PROCESS_PATHS = ("session_callable", "tf2_signature")
Turn = tuple[str, str, int]  # (server, workload, clients)
Turns = dict[Turn, dict]  # one round's results


@dataclass(frozen=True)
class Measure:
    """One target: what it compares, its bound, the figure of a round, and whether a median meets
    it; a figure with no bound (`meets` None) is reported in the notes, for reference."""

    name: str
    target: str
    figure: Callable[[Turns], float]
    meets: Callable[[float], bool] | None
    form: str
    against_ceiling: bool = False  # compares with ceiling.json's figure: judged only on its CPU


@dataclass(frozen=True)
class Phase:
    """One model's servers, the turns of a round, and its targets."""

    model: str
    configure: Callable[[Path, dict], dict[str, servers.Server]]
    turns: tuple[Turn, ...]
    measures: Callable[[dict], list[Measure]]
    rounds: tuple[int, int]  # (full, --quick)
    seconds: tuple[float, float]


def _mlp_servers(workdir: Path, ceiling: dict) -> dict[str, servers.Server]:
    paths = build_all(str(workdir))
    answers = servers.floor_answers(workdir, "mlp", ceiling["mlp"]["reference_output"])
    return {
        FLOOR: servers.floor("mlp", answers),
        DEFAULTS: servers.tfservo_defaults("mlp", paths["mlp"]),
        PYTRITON: _pytriton("mlp", paths["mlp_version"]),
        OFF: servers.tfservo("mlp", paths["mlp"], batching=None, workers=1),
        LEAST: servers.least(paths["mlp_version"]),
    }


def _resnet_servers(workdir: Path, ceiling: dict) -> dict[str, servers.Server]:
    paths = build_all(str(workdir))
    return {DEFAULTS: servers.tfservo_defaults("resnet", paths["resnet50"]),
            PYTRITON: _pytriton("resnet", paths["resnet50_version"])}


def _pytriton(model: str, version: str) -> servers.Server:
    batching = BATCHING[model]
    return servers.pytriton(model, version, max_batch_size=batching["max_batch_size"],
                            queue_delay_micros=batching["batch_timeout_micros"])


def _ratio(a: Turn, b: Turn) -> Callable[[Turns], float]:
    return lambda t: t[a]["rps"] / t[b]["rps"]


def _p50_over(a: Turn, b: Turn) -> Callable[[Turns], float]:
    return lambda t: t[a]["p50_ms"] - t[b]["p50_ms"]


def _mlp_measures(ceiling: dict) -> list[Measure]:
    in_process = ceiling["mlp"]["batch1_p50_ms"]
    return [
        Measure("MLP, 32 clients: defaults ÷ HTTP floor", "≥ 0.50×", _ratio((DEFAULTS, "mlp", 32), (FLOOR, "mlp", 32)),
                lambda m: m >= 0.5, "{:.2f}×"),
        Measure("MLP, 32 clients: defaults ÷ PyTriton", "≥ 3×", _ratio((DEFAULTS, "mlp", 32), (PYTRITON, "mlp", 32)),
                lambda m: m >= 3, "{:.2f}×"),
        Measure(f"MLP, 1 client: defaults p50 − the in-process call ({in_process:.3f} ms)", "≤ 0.3 ms",
                lambda t: t[(DEFAULTS, "mlp", 1)]["p50_ms"] - in_process, lambda m: m <= 0.3, "{:+.3f} ms",
                against_ceiling=True),
        Measure("MLP, 1 client: defaults p50 − batching off p50", "≤ 0.2 ms",
                lambda t: t[(DEFAULTS, "mlp", 1)]["p50_ms"] - t[(OFF, "mlp", 1)]["p50_ms"], lambda m: m <= 0.2,
                "{:+.3f} ms"),
        # What tfservo's own layers cost beside the least server (the work alone), and what the
        # work costs beside the floor: no target, the figures behind the two above.
        Measure("MLP, 1 client: defaults p50 − least server p50", "", _p50_over((DEFAULTS, "mlp", 1), (LEAST, "mlp", 1)),
                None, "{:+.3f} ms"),
        Measure(f"MLP, 1 client: least server p50 − the in-process call ({in_process:.3f} ms)", "",
                lambda t: t[(LEAST, "mlp", 1)]["p50_ms"] - in_process, None, "{:+.3f} ms"),
        Measure("MLP, 32 clients: defaults ÷ least server", "", _ratio((DEFAULTS, "mlp", 32), (LEAST, "mlp", 32)),
                None, "{:.2f}×"),
        Measure("MLP, 32 clients: least server ÷ HTTP floor", "", _ratio((LEAST, "mlp", 32), (FLOOR, "mlp", 32)),
                None, "{:.2f}×"),
    ]


def _resnet_measures(ceiling: dict) -> list[Measure]:
    out = []
    for workload in ("resnet_b64", "resnet_float"):
        out += [
            Measure(f"{workload}, 8 clients: defaults ÷ the in-process call", "≥ 0.95×",
                    _ratio((DEFAULTS, workload, 8), (IN_PROCESS, "resnet", 8)), lambda m: m >= 0.95, "{:.2f}×"),
            Measure(f"{workload}, 8 clients: defaults ÷ PyTriton", "≥ 1.05×",
                    _ratio((DEFAULTS, workload, 8), (PYTRITON, workload, 8)), lambda m: m >= 1.05, "{:.2f}×"),
        ]
    return out


PHASES = (
    Phase("mlp", _mlp_servers,
          ((FLOOR, "mlp", 32), (DEFAULTS, "mlp", 32), (PYTRITON, "mlp", 32), (LEAST, "mlp", 32), (DEFAULTS, "mlp", 1),
           (OFF, "mlp", 1), (LEAST, "mlp", 1)),
          _mlp_measures, rounds=(7, 3), seconds=(5.0, 3.0)),
    Phase("resnet", _resnet_servers,
          ((DEFAULTS, "resnet_b64", 8), (PYTRITON, "resnet_b64", 8), (IN_PROCESS, "resnet", 8),
           (DEFAULTS, "resnet_float", 8), (PYTRITON, "resnet_float", 8)),
          _resnet_measures, rounds=(3, 2), seconds=(15.0, 5.0)),
)


def start_all(configured: dict[str, servers.Server], workdir: Path, ceiling: dict, logs: Path) -> None:
    """Start every server and check one answer per workload; on a failure, stop those started."""
    started: list[servers.Server] = []
    try:
        for server in configured.values():
            server.start(logs)
            started.append(server)
            for workload, ep in server.endpoints.items():
                model = "resnet" if workload.startswith("resnet") else "mlp"
                body = (workdir / "bodies" / ep.body).read_bytes()
                check_answer(server, workload, body, ceiling[model]["reference_output"])
    except BaseException:
        for server in started:
            server.stop()
        raise


def drive(phase: Phase, started: dict[str, servers.Server], workdir: Path, rounds: int, seconds: float) -> list[dict]:
    """Every turn of every round: {round, server, workload, clients, rps, …}."""
    def run(turn: Turn, secs: float) -> dict:
        name, workload, clients = turn
        if name == IN_PROCESS:
            secs = min(secs, 8.0)  # each path loads the model in a process of its own first
            paths = {path: measure_alone(path, phase.model, str(workdir), secs, [clients]) for path in IN_PROCESS_PATHS}
            best = max(paths, key=lambda p: paths[p]["best_rows_per_s"])
            return {"rps": paths[best]["best_rows_per_s"], "path": best,
                    "paths": {p: v["best_rows_per_s"] for p, v in paths.items()}, "errors": 0}
        server = started[name]
        ep = server.endpoints[workload]
        assert server.proc is not None
        return run_wrk(server.base_url + ep.path, str(workdir / "bodies" / ep.body), connections=clients,
                       seconds=secs, server_pid=server.proc.pid)

    for turn in phase.turns:  # warm: the first calls of each batch size build kernels
        if turn[0] != IN_PROCESS:
            run(turn, max(2.0, seconds / 3))
    runs = []
    turns = phase.turns
    for r in range(rounds):
        for turn in turns[r % len(turns):] + turns[: r % len(turns)]:
            result = run(turn, seconds)
            if result["errors"]:
                raise RuntimeError(f"{turn}: {result['error_kinds']}")
            name, workload, clients = turn
            runs.append({"round": r, "server": name, "workload": workload, "clients": clients, **result})
            print(f"round {r}: {name}, {workload}, {clients} clients: {result['rps']:.1f}/s"
                  + (f", p50 {result['p50_ms']:.3f} ms" if "p50_ms" in result else ""), flush=True)
    return runs


def per_round(runs: Sequence[dict], figure: Callable[[Turns], float]) -> list[float]:
    """`figure(that round's runs by turn)` for each round."""
    by_round: dict[int, Turns] = {}
    for run in runs:
        by_round.setdefault(run["round"], {})[(run["server"], run["workload"], run["clients"])] = run
    return [figure(turns) for _, turns in sorted(by_round.items())]


def target_rows(measures: list[Measure], runs: Sequence[dict], ceiling_doc: dict) -> list[dict]:
    """One row per target; one compared with ceiling.json is judged only on the ceiling's CPU."""
    rows = []
    for m in measures:
        if m.meets is None:
            continue
        values = per_round(runs, m.figure)
        median = statistics.median(values)
        ok = m.meets(median)
        judged = verdict_against(ok, {"cpu": cpu()}, ceiling_doc) if m.against_ceiling else verdict(ok)
        rows.append({
            "measure": m.name, "target": m.target, "median of the rounds": m.form.format(median),
            "lowest round": m.form.format(min(values)), "highest round": m.form.format(max(values)),
            "rounds": len(values), "verdict": judged,
        })
    return rows


def reference_notes(measures: list[Measure], runs: Sequence[dict]) -> list[str]:
    """The figures with no target, each as the median over the rounds with their range."""
    out = []
    for m in measures:
        if m.meets is None:
            values = per_round(runs, m.figure)
            out.append(f"- {m.name}: {m.form.format(statistics.median(values))} "
                       f"(rounds {m.form.format(min(values))} to {m.form.format(max(values))})")
    return out


def turn_notes(phase: Phase, runs: Sequence[dict]) -> list[str]:
    out = []
    for name, workload, clients in phase.turns:
        mine = [r for r in runs if (r["server"], r["workload"], r["clients"]) == (name, workload, clients)]
        rates = [r["rps"] for r in mine]
        who = name if name == IN_PROCESS else f"{name}, {clients} client{'s' if clients > 1 else ''}"
        line = (f"- {workload}, {who}: median {statistics.median(rates):,.1f}/s "
                f"(rounds {min(rates):,.1f}–{max(rates):,.1f})")
        if name == IN_PROCESS:
            line += f"; the faster path in some round: {', '.join(sorted({r['path'] for r in mine}))}"
        else:
            line += (f", p50 {statistics.median(r['p50_ms'] for r in mine):.3f} ms, server "
                     f"{statistics.median(r['server_cores'] for r in mine):.2f} cores")
        out.append(line)
    return out


def main() -> None:
    args = section_arguments()
    pick = 1 if args.quick else 0
    workdir, results = Path(args.workdir).resolve(), Path(args.results)
    ceiling = json.loads((results / "ceiling.json").read_text())
    rows: list[dict] = []
    notes: list[str] = []
    runs: list[dict] = []
    for phase in PHASES:
        rounds, seconds = phase.rounds[pick], phase.seconds[pick]
        configured = phase.configure(workdir, ceiling)
        start_all(configured, workdir, ceiling, results / "logs")
        try:
            mine = drive(phase, configured, workdir, rounds, seconds)
        finally:
            for server in configured.values():
                server.stop()
        runs += mine
        measures = phase.measures(ceiling)
        rows += target_rows(measures, mine, ceiling[phase.model])
        notes += [f"{phase.model}: {rounds} rounds of {seconds:g} s per turn;", *turn_notes(phase, mine),
                  *reference_notes(measures, mine), ""]
    save_section(results, "targets", {
        "title": "Issue 28's serving targets, side by side: a model's servers running at once, driven in turns",
        "rows": rows,
        "notes": [
            f"On {cpu()}. Within a round the turns run back to back, and each round starts one turn later "
            "than the last (bench/targets_bench.py). A model's servers are up together, the idle ones waiting "
            "on their sockets; the in-process call runs in processes of its own, one per call path. Each "
            "ratio is taken within one round; the figure is the median over the rounds.",
            "",
            *notes,
        ],
        "runs": runs,
    })


if __name__ == "__main__":
    main()
