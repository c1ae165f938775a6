"""`tfservo tune`'s search: from the settings `serve` picks for this machine, one setting at a
time (workers, then TensorFlow's threads, then batching; batching first for a model slower than
SLOW_MS alone), keeping a change only when it gains more throughput at the latency target than
the noise measured on the starting point, until a whole pass changes nothing or the budget is
spent. Protocols are compared on the first server
(no restart needed) and the best one is used from then on.

The pick is then checked open loop (Poisson arrivals at its throughput, stepped down until its
p99 meets the target): the rate it sustains is what the instance count and the scaling targets
are computed from.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tfservo.core import environment
from tfservo.core.memory import usable_cores
from tfservo.core.settings import DEFAULT_MODEL_ENV, ConfigError, auto_workers, threads_per_worker
from tfservo.models.bundle import open_bundle
from tfservo.tune.load import LoadResult, closed_loop, open_loop
from tfservo.tune.trial import Candidate, Ladder, ServerUnderTest, measure_ladder, warm, write_config
from tfservo.tune.workload import Workload, generated_workload, invocations_workload

__all__ = ["TuneOptions", "TuneResult", "Trial", "baseline", "dimensions", "tune", "with_change"]

NOISE_FLOOR = 0.02  # never trust a gain under 2 %, however quiet the first repeat was
OPEN_LOOP_STEPS = (1.0, 0.85, 0.7, 0.55, 0.4)  # shares of the closed-loop rate tried open loop
OPEN_LOOP_CLIENTS = 64  # more threads only fight over the interpreter's lock
SLOW_MS = 5.0  # a model this slow per request alone tries batching first
GENERATOR_BOUND = 0.25  # sends later than this share of the target (p99): the generator is the limit


@dataclass(frozen=True)
class TuneOptions:
    """What `tfservo tune` was asked."""

    bundle: str
    p99_ms: float
    budget_s: float
    out_dir: str
    requests_file: str | None = None
    content_type: str = "application/json"
    accept: str | None = None
    rows: int = 1
    step_s: float = 2.0
    protocols: tuple[str, ...] = ()  # empty: every protocol the workload has
    max_workers: int = 0  # 0: the usable cores
    model: str | None = None


@dataclass
class Trial:
    """One candidate's server and what it measured."""

    candidate: Candidate
    ladders: dict[str, Ladder]
    seconds: float
    protocol: str  # the ladder that scores it

    @property
    def rps(self) -> float:
        return self.ladders[self.protocol].rps_at_target

    @property
    def concurrency(self) -> int:
        return self.ladders[self.protocol].concurrency_at_target


@dataclass
class TuneResult:
    """Every trial, the noise, the pick, and its open-loop check."""

    options: TuneOptions
    workload: Workload
    cores: int
    trials: list[Trial] = field(default_factory=list)
    noise: float = 0.0
    best: Trial | None = None
    open_runs: list[LoadResult] = field(default_factory=list)
    seconds: float = 0.0
    stopped: str = ""  # why the search ended

    @property
    def generator_bound(self) -> bool:
        """Whether the generator sent open-loop requests late (it, not the server, was the limit)."""
        return any(r.lag_p99_ms > GENERATOR_BOUND * self.options.p99_ms for r in self.open_runs)

    @property
    def sustained_rps(self) -> float:
        """The open-loop rate whose p99 met the target (0: none did)."""
        passing = [r for r in self.open_runs if r.errors == 0 and r.p99_ms <= self.options.p99_ms]
        return max((r.rps for r in passing), default=0.0)


def baseline(bundle: str, cores: int) -> Candidate:
    """What `tfservo serve` picks on this machine when nothing is set (settings.auto_workers)."""
    workers = min(auto_workers([bundle]), cores)
    return Candidate.of({"workers": workers, "intra-op-threads": threads_per_worker(workers), "batching": "auto"})


def dimensions(cores: int, max_workers: int,
               slow: bool = False) -> list[tuple[str, Callable[[dict[str, Any]], list[dict[str, Any]]]]]:
    """Each setting the search moves, with the values it tries given the current ones. For a
    `slow` model (SLOW_MS or more per request alone) batching comes first, timeouts before off:
    its trials cost tens of seconds, and batching is where such a model gains (docs/decisions.md)."""
    top = max_workers or cores

    def workers(v: dict[str, Any]) -> list[dict[str, Any]]:
        counts = sorted({1, 2, *(n for n in (4, 8, 16) if n <= top), top} - {0})
        return [{"workers": n, "intra-op-threads": max(1, cores // n)} for n in counts if n <= top]

    def threads(v: dict[str, Any]) -> list[dict[str, Any]]:
        share = max(1, cores // int(v["workers"]))
        return [{"intra-op-threads": n} for n in sorted({1, share, cores})]

    def batching(v: dict[str, Any]) -> list[dict[str, Any]]:
        plain = {"SAGEMAKER_TFS_MAX_BATCH_SIZE": None, "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": None}
        timeouts = [
            {"batching": "timeout", "SAGEMAKER_TFS_MAX_BATCH_SIZE": size, "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": micros}
            for size, micros in ((8, 1000), (32, 5000))
        ]
        plain_modes = [{**plain, "batching": "auto"}, {**plain, "batching": "off"}]
        return [*timeouts, *plain_modes] if slow else [*plain_modes, *timeouts]

    moves: list[tuple[str, Callable[[dict[str, Any]], list[dict[str, Any]]]]] = [("workers", workers), ("intra-op-threads", threads), ("batching", batching)]
    return [moves[2], moves[1], moves[0]] if slow else moves


def with_change(candidate: Candidate, change: dict[str, Any]) -> Candidate:
    """`candidate` with `change` applied (a None value removes the key)."""
    values = candidate.values
    for key, value in change.items():
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value
    return Candidate.of(values)


def tune(options: TuneOptions, progress: Callable[[str], None]) -> TuneResult:
    """Run the search within options.budget_s; see the module's docstring."""
    started = time.monotonic()
    os.makedirs(options.out_dir, exist_ok=True)
    cores = usable_cores()
    log_path = os.path.join(options.out_dir, "servers.log")
    def reserve() -> float:
        """What the open-loop check at the end costs: a server's start and every step it may run."""
        return ServerUnderTest.last_start_s + len(OPEN_LOOP_STEPS) * (1.5 * options.step_s + 0.4) + 2

    def left() -> float:
        return options.budget_s - (time.monotonic() - started)

    def out_of_time() -> bool:
        return left() < reserve()

    first = baseline(options.bundle, min(cores, options.max_workers or cores))
    workload: Workload | None = None
    if options.requests_file:  # checked before any server starts
        workload = invocations_workload(options.requests_file, options.content_type, options.accept)
    result: TuneResult | None = None
    seen: dict[Candidate, Trial] = {}

    def run(candidate: Candidate, protocols: list[str] | None) -> Trial:
        nonlocal workload
        t0 = time.monotonic()
        config = os.path.join(options.out_dir, "trial.toml")
        write_config(config, [options.bundle], candidate.values)
        progress(f"trial {len(seen) + 1}: {candidate.label()}")
        with ServerUnderTest(config, log_path) as server:
            if workload is None:
                workload = _workload(options, server)
            chosen = protocols or [p for p in workload.protocols if not options.protocols or p in options.protocols]
            ladders = {p: measure_ladder(server, workload, p, options.p99_ms, options.step_s, out_of_time, progress)
                       for p in chosen}
        best_protocol = max(ladders, key=lambda p: ladders[p].rps_at_target)
        trial = Trial(candidate, ladders, time.monotonic() - t0, best_protocol)
        seen[candidate] = trial
        progress(f"  → {trial.rps:.1f} req/s at p99 ≤ {options.p99_ms:g} ms ({best_protocol}, "
                 f"{trial.concurrency} clients), {trial.seconds:.0f} s")
        return trial

    best = run(first, None)
    assert workload is not None
    result = TuneResult(options, workload, cores)
    result.trials.append(best)
    protocol = best.protocol
    result.noise = _noise(options, workload, best, log_path, out_of_time, progress)
    result.stopped = "a whole pass gained nothing beyond the noise"
    trial_cost = best.seconds / len(best.ladders)  # later trials measure one protocol
    alone = best.ladders[protocol].runs[0] if best.ladders[protocol].runs else None
    slow = alone is not None and alone.p50_ms >= SLOW_MS
    for _ in range(3):
        changed = False
        for name, values in dimensions(cores, options.max_workers, slow=slow):
            for change in values(best.candidate.values):
                candidate = with_change(best.candidate, change)
                if candidate in seen:
                    continue
                if left() - reserve() < trial_cost:
                    result.stopped = "the budget was spent"
                    break
                trial = run(candidate, [protocol])
                trial_cost = max(trial_cost, trial.seconds)
                result.trials.append(trial)
                if trial.rps > best.rps * (1 + result.noise):
                    progress(f"  kept: {name} (+{(trial.rps / max(best.rps, 1e-9) - 1) * 100:.0f} %)")
                    best, changed = trial, True
            else:
                continue
            break
        if result.stopped == "the budget was spent" or not changed:
            break
    result.best = best
    result.open_runs = _open_loop_check(options, workload, best, log_path, progress)
    result.seconds = time.monotonic() - started
    return result


def _workload(options: TuneOptions, server: ServerUnderTest) -> Workload:
    """Rows generated from the signature the server reports for the model."""
    name = options.model or _default_model(options.bundle)
    metadata = server.get_json(f"/v2/models/{name}")
    return generated_workload(metadata, options.rows)


def _default_model(bundle: str) -> str:
    """The model a request naming none reaches: $SAGEMAKER_TFS_DEFAULT_MODEL_NAME, else the
    bundle's first by name (as the service picks it)."""
    wanted = environment.current().get(DEFAULT_MODEL_ENV)
    if wanted:
        return wanted
    names = sorted(open_bundle(bundle).models)
    if not names:
        raise ConfigError(f"{bundle} holds no model; name one with --model")
    return names[0]


def _noise(options: TuneOptions, workload: Workload, trial: Trial, log_path: str, out_of_time: Callable[[], bool],
           progress: Callable[[str], None]) -> float:
    """The relative spread of the starting point's score, measured again on a fresh server."""
    ladder = trial.ladders[trial.protocol]
    level = ladder.concurrency_at_target or 1
    if out_of_time():
        return 0.1
    config = os.path.join(options.out_dir, "trial.toml")
    write_config(config, [options.bundle], trial.candidate.values)
    progress(f"noise: the first trial again at {level} clients")
    with ServerUnderTest(config, log_path) as server:
        target = server.target(workload, trial.protocol)
        try:
            warm(target, options.step_s)
            runs = [closed_loop(target, level, options.step_s) for _ in range(2)]
        finally:
            _close(target)
    scores = [r.rps for r in runs] + [ladder.rps_at_target]
    spread = (max(scores) - min(scores)) / max(max(scores), 1e-9)
    noise = max(NOISE_FLOOR, spread)
    progress(f"  noise {noise * 100:.1f} % ({', '.join(f'{s:.1f}' for s in scores)} req/s)")
    return noise


def _close(target: object) -> None:
    close = getattr(target, "close", None)
    if close is not None:
        close()


def _open_loop_check(options: TuneOptions, workload: Workload, best: Trial, log_path: str,
                     progress: Callable[[str], None]) -> list[LoadResult]:
    """Poisson arrivals at the pick's closed-loop rate, stepped down until p99 meets the target."""
    rate = best.rps
    if rate <= 0:
        return []
    config = os.path.join(options.out_dir, "trial.toml")
    write_config(config, [options.bundle], best.candidate.values)
    runs: list[LoadResult] = []
    progress(f"open loop: {best.candidate.label()}, {best.protocol}")
    with ServerUnderTest(config, log_path) as server:
        target = server.target(workload, best.protocol)
        try:
            for share in OPEN_LOOP_STEPS:
                run = open_loop(target, rate * share, options.step_s * 1.5,
                                clients=min(OPEN_LOOP_CLIENTS, max(16, 4 * best.concurrency)))
                runs.append(run)
                progress(f"  {rate * share:9.1f} req/s offered  {run.rps:9.1f} answered  p50 {run.p50_ms:8.2f} ms  "
                         f"p99 {run.p99_ms:8.2f} ms  (sent up to {run.lag_p99_ms:.1f} ms late)")
                if run.errors == 0 and run.p99_ms <= options.p99_ms:
                    break
        finally:
            _close(target)
    return runs
