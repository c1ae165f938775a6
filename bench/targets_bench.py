"""Issue 28's MLP targets measured side by side: tfservo's defaults, the HTTP floor (the do-nothing
app on uvicorn + httptools) and PyTriton at 32 clients, and the defaults and batching off (one
worker) at one client. All four servers run at once and wrk drives them in turn, round after
round, the order rotated each round. Each target's ratio is taken within a round, where drift
on a shared machine hits both sides alike, and its figure is the median over the rounds, with
the lowest and highest round beside it. The serving tables run each server once, minutes
apart; on this project's machine a server's figure moves by ±20 % between such runs, and a
ratio of two of them by more.

Writes RESULTS/targets.json in the report's section format.

Usage: python bench/targets_bench.py WORKDIR RESULTS [--quick]
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

import servers
from load import run_wrk
from models import build_all
from report import save_section, section_arguments
from serving import BATCHING, check_answer, cpu

DEFAULTS, FLOOR, PYTRITON, OFF = "tfservo defaults", "HTTP floor", "PyTriton", "tfservo batching off, 1 worker"
# (server, clients) pairs driven in each round, in the first round's order
TURNS = ((FLOOR, 32), (DEFAULTS, 32), (PYTRITON, 32), (DEFAULTS, 1), (OFF, 1))


def start_all(workdir: Path, ceiling: dict, logs: Path) -> dict[str, servers.Server]:
    paths = build_all(str(workdir))
    answers = servers.floor_answers(workdir, "mlp", ceiling["mlp"]["reference_output"])
    batching = BATCHING["mlp"]
    configured = {
        FLOOR: servers.floor("mlp", answers),
        DEFAULTS: servers.tfservo_defaults("mlp", paths["mlp"]),
        PYTRITON: servers.pytriton("mlp", paths["mlp_version"], max_batch_size=batching["max_batch_size"],
                                   queue_delay_micros=batching["batch_timeout_micros"]),
        OFF: servers.tfservo("mlp", paths["mlp"], batching=None, workers=1),
    }
    started: dict[str, servers.Server] = {}
    try:
        for name, server in configured.items():
            server.start(logs)
            started[name] = server
            body = workdir / "bodies" / server.endpoints["mlp"].body
            check_answer(server, "mlp", body.read_bytes(), ceiling["mlp"]["reference_output"])
    except BaseException:
        for server in started.values():
            server.stop()
        raise
    return started


def drive(started: dict[str, servers.Server], workdir: Path, rounds: int, seconds: float) -> list[dict]:
    """Every turn of every round: {round, server, clients, **run_wrk's result}."""
    def run(name: str, clients: int, secs: float) -> dict:
        server = started[name]
        ep = server.endpoints["mlp"]
        assert server.proc is not None
        return run_wrk(server.base_url + ep.path, str(workdir / "bodies" / ep.body), connections=clients,
                       seconds=secs, server_pid=server.proc.pid)

    for name in started:
        run(name, 32, 2)  # warm: first calls of each batch size build kernels
    runs = []
    for r in range(rounds):
        for name, clients in TURNS[r % len(TURNS):] + TURNS[: r % len(TURNS)]:
            result = run(name, clients, seconds)
            if result["errors"]:
                raise RuntimeError(f"{name}, {clients} clients: {result['error_kinds']}")
            runs.append({"round": r, "server": name, "clients": clients, **result})
            print(f"round {r}: {name}, {clients} clients: {result['rps']:.0f} req/s, p50 {result['p50_ms']:.3f} ms",
                  flush=True)
    return runs


def per_round(runs: list[dict], figure: Callable[[dict[tuple[str, int], dict]], float]) -> list[float]:
    """`figure(that round's runs by (server, clients))` for each round."""
    by_round: dict[int, dict[tuple[str, int], dict]] = {}
    for run in runs:
        by_round.setdefault(run["round"], {})[(run["server"], run["clients"])] = run
    return [figure(turns) for _, turns in sorted(by_round.items())]


def target_rows(runs: list[dict], ceiling: dict) -> list[dict]:
    in_process = ceiling["mlp"]["batch1_p50_ms"]
    comparable = ceiling["mlp"].get("cpu") == cpu()
    measures = [
        # (measure, target, per-round figure, whether the median meets it, format)
        ("defaults ÷ HTTP floor, 32 clients", "≥ 0.50×",
         lambda t: t[(DEFAULTS, 32)]["rps"] / t[(FLOOR, 32)]["rps"], lambda m: m >= 0.5, "{:.2f}×"),
        ("defaults ÷ PyTriton, 32 clients", "≥ 3×",
         lambda t: t[(DEFAULTS, 32)]["rps"] / t[(PYTRITON, 32)]["rps"], lambda m: m >= 3, "{:.2f}×"),
        (f"defaults p50 − the in-process call ({in_process:.3f} ms), 1 client", "≤ 0.3 ms",
         lambda t: t[(DEFAULTS, 1)]["p50_ms"] - in_process, lambda m: m <= 0.3, "{:+.3f} ms"),
        ("defaults p50 − batching off p50, 1 client", "≤ 0.2 ms",
         lambda t: t[(DEFAULTS, 1)]["p50_ms"] - t[(OFF, 1)]["p50_ms"], lambda m: m <= 0.2, "{:+.3f} ms"),
    ]
    rows = []
    for measure, target, figure, meets, fmt in measures:
        values = per_round(runs, figure)
        median = statistics.median(values)
        verdict = "met" if meets(median) else "missed"
        if "in-process" in measure and not comparable:
            verdict = f"not comparable: the ceiling ran on {ceiling['mlp'].get('cpu')}, this on {cpu()}"
        rows.append({
            "measure": measure, "target": target, "median of the rounds": fmt.format(median),
            "lowest round": fmt.format(min(values)), "highest round": fmt.format(max(values)),
            "rounds": len(values), "verdict": verdict,
        })
    return rows


def server_notes(runs: list[dict]) -> list[str]:
    out = []
    for name, clients in TURNS:
        mine = [r for r in runs if r["server"] == name and r["clients"] == clients]
        rps = [r["rps"] for r in mine]
        out.append(f"- {name}, {clients} client{'s' if clients > 1 else ''}: median {statistics.median(rps):,.0f} req/s "
                   f"(rounds {min(rps):,.0f}–{max(rps):,.0f}), p50 {statistics.median(r['p50_ms'] for r in mine):.3f} ms, "
                   f"server {statistics.median(r['server_cores'] for r in mine):.2f} cores")
    return out


def main() -> None:
    args = section_arguments()
    rounds, seconds = (3, 3.0) if args.quick else (7, 5.0)
    workdir, results = Path(args.workdir).resolve(), Path(args.results)
    ceiling = json.loads((results / "ceiling.json").read_text())
    logs = results / "logs"
    started = start_all(workdir, ceiling, logs)
    try:
        runs = drive(started, workdir, rounds, seconds)
    finally:
        for server in started.values():
            server.stop()
    save_section(results, "targets", {
        "title": "Issue 28's MLP targets, side by side: the servers running at once, driven in turns",
        "rows": target_rows(runs, ceiling),
        "notes": [
            f"{rounds} rounds of {seconds:g} s per server and client count on {cpu()}; within a round the turns "
            "run back to back, and each round starts one turn later than the last (bench/targets_bench.py). "
            "The four servers are up together, the idle ones waiting on their sockets. Each ratio is taken "
            "within one round; the figure is the median over the rounds.",
            "",
            *server_notes(runs),
        ],
        "runs": runs,
    })


if __name__ == "__main__":
    main()
