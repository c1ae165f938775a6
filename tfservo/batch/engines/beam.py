"""The transform job as an Apache Beam pipeline (`tfservo transform --runner beam`).

The same pieces as the local engine, spread over Beam workers: each object not done yet is
read, split and packed into requests (records.py), the requests are reshuffled across
workers, each worker holds one loaded ModelService and runs every request through
calls.BatchCaller (the /invocations path), and the answers are grouped back per object,
put in order and written atomically (sinks.py). So the .out files are the local engine's,
byte for byte. Each object's outcome is left in a hidden folder of OUTPUT for the driver,
which writes the same failure report (state.py) and removes the folder.
"""

from __future__ import annotations

import difflib
import logging
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from tfservo.batch.engines import beam_progress
from tfservo.batch.engines.distributed import (
    Answer,
    Request,
    Tail,
    call_request,
    outcome_from_json,
    outcome_json,
    outcome_name,
    release_services,
    split_object,
    worker_service,
    write_object,
)
from tfservo.batch.engines.driver import start_driver_run
from tfservo.batch.job import JobError, TransformJob
from tfservo.batch.records import Wire
from tfservo.batch.sinks import OutputStore
from tfservo.batch.sources import InputObject
from tfservo.batch.state import ObjectOutcome, RecordFailure, TransformSummary
from tfservo.core.extras import require
from tfservo.core.logs import quiet_libraries

__all__ = [
    "METRICS",
    "OUTCOMES_PREFIX",
    "BeamSettings",
    "beam_pipeline_flags",
    "beam_runner_name",
    "known_beam_runners",
    "run_beam_transform",
]

log = logging.getLogger("tfservo.batch")

OUTCOMES_PREFIX = "beam-run-"  # <state>/beam-run-<run id>/: one outcome per object, removed at the end
METRICS = "tfservo.batch"


# -- flags ------------------------------------------------------------------------------------


def known_beam_runners() -> list[str]:
    """Beam's runner class names (DirectRunner, DataflowRunner, FlinkRunner, ...)."""
    StandardOptions = require("--runner beam", "beam", "apache_beam.options.pipeline_options").StandardOptions

    return sorted({path.rsplit(".", 1)[-1] for path in StandardOptions.ALL_KNOWN_RUNNERS})


def beam_runner_name(name: str) -> str:
    """The canonical spelling of a Beam runner name ('direct' → DirectRunner), or JobError listing them."""
    known = known_beam_runners()
    wanted = name.strip().lower()
    for runner in known:
        if wanted in (runner.lower(), runner.lower().removesuffix("runner")):
            return runner
    raise JobError(f"--beam-runner {name!r} is not a Beam runner; use one of {', '.join(known)}")


def beam_pipeline_flags(runner: str, pairs: Iterable[str]) -> list[str]:
    """--beam-option KEY=VALUE pairs (or bare KEY for a boolean option) → Beam's command-line
    flags, checked against every option Beam knows; JobError names the one that is wrong."""
    flags = [f"--runner={beam_runner_name(runner)}"]
    from apache_beam.options.pipeline_options import PipelineOptions

    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().lstrip("-")
        if not key:
            raise JobError(f"--beam-option {pair!r} is not KEY=VALUE (e.g. direct_num_workers=2)")
        if key == "runner":
            raise JobError(f"--beam-option {pair!r}: choose the runner with --beam-runner")
        flags.append(f"--{key}={value}" if sep else f"--{key}")
    options = PipelineOptions(flags)
    known = options.get_all_options(retain_unknown_options=False)
    every = options.get_all_options(retain_unknown_options=True)
    unknown = sorted(set(every) - set(known))
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, list(known), n=1)
            hints.append(f"{key}" + (f" (did you mean {close[0]}?)" if close else ""))
        raise JobError(
            f"--beam-option: Beam has no option {', '.join(hints)}; see "
            "https://beam.apache.org/documentation/runners/capability-matrix/ and the runner's pipeline options"
        )
    return flags


# -- the pipeline's steps -------------------------------------------------------------------------


def _dofns() -> tuple[type, type]:
    """The DoFns, defined when Beam is imported (only for --runner beam)."""
    import apache_beam as beam
    from apache_beam.metrics.metric import Metrics
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import MIN_TIMESTAMP
    from apache_beam.utils.windowed_value import WindowedValue

    class CallModel(beam.DoFn):
        """Runs each request through the worker's model, --max-concurrent-transforms at a time
        (as the local engine does); passes Tails through."""

        def __init__(self, job: TransformJob, run_id: str = "") -> None:
            self.job = job
            self.run_id = run_id  # for live progress (beam_progress.py)

        def setup(self) -> None:
            self.invoker = worker_service(self.job).invoker
            self.pool = ThreadPoolExecutor(self.job.concurrency, thread_name_prefix="tfservo-beam-model")
            self.pending: deque[Future[tuple[str, Answer, float, int]]] = deque()
            self.requests = Metrics.counter(METRICS, "requests")
            self.records = Metrics.counter(METRICS, "records")
            self.latency = Metrics.distribution(METRICS, "request_latency_ms")

        def teardown(self) -> None:
            self.pool.shutdown(wait=True)

        def process(self, element: tuple[str, Wire | Tail]) -> Iterator[tuple[str, Wire | Tail]]:
            rel, wire = element
            if isinstance(wire, Tail):
                yield rel, wire
                return
            self.pending.append(self.pool.submit(self._call, rel, Request.unwire(wire)))
            while self.pending and (self.pending[0].done() or len(self.pending) > 2 * self.job.concurrency):
                yield self._answer(self.pending.popleft().result())

        def finish_bundle(self) -> Iterator[WindowedValue]:
            while self.pending:
                yield WindowedValue(self._answer(self.pending.popleft().result()), MIN_TIMESTAMP, (GlobalWindow(),))

        def _call(self, rel: str, part: Request) -> tuple[str, Answer, float, int]:
            started = time.monotonic()
            answer = call_request(self.invoker, self.job, rel, part)
            return rel, answer, time.monotonic() - started, part.nbytes

        def _answer(self, done: tuple[str, Answer, float, int]) -> tuple[str, Wire]:
            rel, answer, seconds, nbytes = done
            self.latency.update(int(seconds * 1000))
            self.requests.inc()
            self.records.inc(answer.records)
            beam_progress.request_done(self.run_id, rel, 0 if answer.failure else answer.records, nbytes)
            return rel, answer.wire()

    class WriteObject(beam.DoFn):
        """Puts one object's answers in order, publishes its .out (or not) and records the outcome."""

        def __init__(self, job: TransformJob, stale_dead_letters: set[str], outcomes: str) -> None:
            self.job = job
            self.stale = stale_dead_letters
            self.outcomes = outcomes

        def setup(self) -> None:
            self.store, self.state = OutputStore(self.job.output), OutputStore(self.job.state_url)
            self.done = Metrics.counter(METRICS, "objects_done")
            self.failed = Metrics.counter(METRICS, "objects_failed")

        def process(self, element: tuple[str, Iterable[Wire | Tail]]) -> Iterator[str]:
            rel, parts = element[0], list(element[1])
            tails = [p for p in parts if isinstance(p, Tail)]
            answers = sorted((Answer.unwire(p) for p in parts if not isinstance(p, Tail)), key=lambda a: a.seq)
            if len(tails) != 1 or len(answers) != tails[0].requests:
                raise RuntimeError(f"{rel}: expected one tail and {tails[0].requests if tails else '?'} answers, "
                                   f"got {len(tails)} tails and {len(answers)} answers")
            outcome = write_object(self.job, self.store, self.state, tails[0], answers, self.stale)
            (self.done if outcome.status == "done" else self.failed).inc()
            beam_progress.object_done(self.outcomes, tails[0].obj, outcome.status != "done")
            self.state.put(outcome_name(self.outcomes, rel), outcome_json(outcome))
            yield rel

    return CallModel, WriteObject


def _read_outcome(store: OutputStore, folder: str, obj: InputObject) -> ObjectOutcome:
    try:
        return outcome_from_json(obj, store.get(outcome_name(folder, obj.rel)))
    except FileNotFoundError:
        return ObjectOutcome(obj, "failed", 0, RecordFailure("the object", "the pipeline finished without writing it"))


# -- the driver -------------------------------------------------------------------------------------


@dataclass
class BeamSettings:
    """--beam-runner and --beam-option, as Beam pipeline flags."""

    runner: str = "DirectRunner"
    options: list[str] = field(default_factory=list)

    def flags(self) -> list[str]:
        return beam_pipeline_flags(self.runner, self.options)


def run_beam_transform(
    job: TransformJob, beam_settings: BeamSettings | None = None, *, progress: str = "auto",
    progress_interval: float = 10.0,
) -> TransformSummary:
    """Run `job` as a Beam pipeline and wait for it; the same outputs, report and summary as
    the local engine's run_transform. `progress` as its, live where the workers are this process."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    flags = (beam_settings or BeamSettings()).flags()
    quiet_libraries("debug" if log.isEnabledFor(logging.DEBUG) else "info")  # Beam's lines would drown the job's
    run = start_driver_run(job)
    job, todo, state = run.job, run.todo, run.state
    outcomes: list[ObjectOutcome] = []
    if todo:
        folder = f"{OUTCOMES_PREFIX}{uuid.uuid4().hex[:12]}"
        CallModel, WriteObject = _dofns()
        log.info("running %d objects on Beam (%s)", len(todo), " ".join(flags))
        try:
            with (
                beam_progress.live_progress(folder, todo, job, flags, progress, progress_interval),
                beam.Pipeline(options=PipelineOptions(flags)) as pipeline,
            ):
                _ = (
                    pipeline
                    | "objects" >> beam.Create(todo, reshuffle=False)
                    | "split" >> beam.FlatMap(split_object, job)
                    | "spread requests" >> beam.Reshuffle()
                    | "call model" >> beam.ParDo(CallModel(job, folder))
                    | "per object" >> beam.GroupByKey()
                    | "write" >> beam.ParDo(WriteObject(job, run.stale_dead_letters, folder))
                )
            beam_progress.log_counters(pipeline.result, METRICS, progress)
            outcomes = [_read_outcome(state, folder, obj) for obj in todo]
        finally:
            release_services()
            _remove_folder(state, folder)
    return run.finish(outcomes)


def _remove_folder(store: OutputStore, folder: str) -> None:
    path = store.path(folder)
    try:
        if store.local:
            import shutil

            shutil.rmtree(path, ignore_errors=True)
        else:
            store.fs.rm(path, recursive=True)
    except (FileNotFoundError, OSError) as exc:
        log.warning("could not remove %s: %s", store.display(folder), exc)
