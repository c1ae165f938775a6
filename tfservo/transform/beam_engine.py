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
import hashlib
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson

from tfservo.bundle import open_bundle
from tfservo.config import archive_limits_from_env
from tfservo.logs import quiet_libraries
from tfservo.transform import beam_progress
from tfservo.transform.calls import BatchCaller, BatchResult
from tfservo.transform.engine import failure_from, list_job_inputs, object_format, request_batches
from tfservo.transform.job import JobError, TransformJob
from tfservo.transform.joiner import DataProcessing
from tfservo.transform.records import RecordBatch, where
from tfservo.transform.sinks import OutputStore
from tfservo.transform.sources import InputObject, OpenedInput
from tfservo.transform.state import (
    DeadLetter,
    ObjectOutcome,
    RecordFailure,
    TransformSummary,
    bundle_versions,
    check_settings,
    dead_letter_name,
    job_description,
    open_output,
    write_report,
)

__all__ = [
    "METRICS",
    "OUTCOMES_PREFIX",
    "RUNNERS",
    "Answer",
    "beam_pipeline_flags",
    "beam_runner_name",
    "BeamSettings",
    "known_beam_runners",
    "release_services",
    "Request",
    "run_beam_transform",
    "split_object",
    "Tail",
    "worker_service",
]

log = logging.getLogger("tfservo.transform")

RUNNERS = ("local", "beam")
OUTCOMES_PREFIX = "beam-run-"  # <state>/beam-run-<run id>/: one outcome per object, removed at the end
METRICS = "tfservo.transform"


# -- flags ------------------------------------------------------------------------------------


def known_beam_runners() -> list[str]:
    """Beam's runner class names (DirectRunner, DataflowRunner, FlinkRunner, ...)."""
    from apache_beam.options.pipeline_options import StandardOptions

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
    from apache_beam.options.pipeline_options import PipelineOptions

    flags = [f"--runner={beam_runner_name(runner)}"]
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


# -- elements ---------------------------------------------------------------------------------


# Requests and answers cross the shuffles as tuples of bytes, ints and strings, which Beam's
# coder writes natively; as dataclasses they went through pickle, 7x slower end to end.


@dataclass(frozen=True)
class Request:
    """One request of an object: its place in the object's order and the records it carries."""

    seq: int
    content_type: str
    record_format: str | None
    batch: RecordBatch

    @property
    def nbytes(self) -> int:
        """Bytes of the (decompressed) object its records span, for progress."""
        return self.batch.nbytes

    def wire(self) -> tuple:
        return ("q", self.seq, self.content_type, self.record_format, self.batch.wire())

    @staticmethod
    def unwire(wire: tuple) -> Request:
        _, seq, content_type, fmt, batch = wire
        return Request(seq, content_type, fmt, RecordBatch.unwire(batch))


@dataclass(frozen=True)
class Answer:
    """What one request added to its object's output: its pieces joined in order."""

    seq: int
    body: bytes
    records: int
    dead: list[DeadLetter]
    failure: RecordFailure | None

    def wire(self) -> tuple:
        dead = [(d.where, d.index, d.data, d.error) for d in self.dead]
        failure = None if self.failure is None else (self.failure.where, self.failure.error, self.failure.record)
        return ("a", self.seq, self.body, self.records, dead, failure)

    @staticmethod
    def unwire(wire: tuple) -> Answer:
        _, seq, body, records, dead, failure = wire
        return Answer(seq, body, records, [DeadLetter(*d) for d in dead], None if failure is None else RecordFailure(*failure))


@dataclass(frozen=True)
class Tail:
    """The end of one object's requests: how many there are and whether reading it failed."""

    obj: InputObject
    requests: int
    read_complete: bool
    read_failure: RecordFailure | None = None


def split_object(obj: InputObject, job: TransformJob) -> Iterator[tuple[str, tuple | Tail]]:
    """(object name, request) for each request of `obj`, then its Tail; never raises for bad input."""
    seq = 0
    try:
        content_type, fmt = object_format(job, obj)
        processing = _processing(job, fmt)
        opened = OpenedInput(obj, job.compression_type)
        try:
            for batch in request_batches(opened, job, processing):
                yield obj.rel, Request(seq, content_type, fmt, batch).wire()
                seq += 1
        finally:
            opened.close()
    except Exception as exc:
        yield obj.rel, Tail(obj, seq, False, failure_from(exc, obj))
        return
    yield obj.rel, Tail(obj, seq, True)


def _processing(job: TransformJob, fmt: str | None) -> DataProcessing:
    return DataProcessing(fmt, job.input_filter_path, job.output_filter_path, job.join_source == "Input")


# -- one loaded model per worker process --------------------------------------------------------

_services: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Any, Any]] = {}
_services_lock = threading.Lock()


def worker_service(job: TransformJob) -> Any:
    """The job's ModelService in this process, loaded once (with --env applied, and a loopback
    server when the bundle has handlers, as `transform` and `serve` do)."""
    from tfservo.loopback import start_handler_endpoints
    from tfservo.transform.run import apply_env, load_service

    quiet_libraries()  # a worker in another process: TF's and Beam's noise off there too
    key = (job.model, tuple(sorted(job.env.items())))
    with _services_lock:
        if key not in _services:
            apply_env(job.env)
            started = time.monotonic()
            service = load_service(job.model)
            loopback = start_handler_endpoints(service)
            log.info("loaded %s in %.1fs in worker process %d", job.model, time.monotonic() - started, os.getpid())
            _services[key] = (service, loopback)
        return _services[key][0]


def release_services() -> None:
    """Close the services this process loaded (the driver, after an in-process runner)."""
    with _services_lock:
        for service, loopback in _services.values():
            if loopback is not None:
                loopback.stop()
            service.close()
        _services.clear()


# -- the pipeline's steps -------------------------------------------------------------------------


def _dofns():
    """The DoFns, defined when Beam is imported (only for --runner beam)."""
    import apache_beam as beam
    from apache_beam.metrics import Metrics
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
            self.pending: deque[Future] = deque()
            self.requests = Metrics.counter(METRICS, "requests")
            self.records = Metrics.counter(METRICS, "records")
            self.latency = Metrics.distribution(METRICS, "request_latency_ms")

        def teardown(self) -> None:
            self.pool.shutdown(wait=True)

        def process(self, element: tuple[str, tuple | Tail]) -> Iterator[tuple[str, tuple | Tail]]:
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

        def _call(self, rel: str, part: Request) -> tuple[str, int, BatchResult, float, int]:
            caller = BatchCaller(self.invoker, self.job, _processing(self.job, part.record_format), part.content_type)
            started = time.monotonic()
            try:
                result = caller.run(part.batch)
            except Exception as exc:  # a bug of ours: fail the object, keep the job going
                log.exception("transforming %s failed", rel)
                result = BatchResult(failure=RecordFailure(
                    where(part.batch.record(0), self.job.split_type), f"internal error: {type(exc).__name__}: {exc}"
                ))
            return rel, part.seq, result, time.monotonic() - started, part.nbytes

        def _answer(self, done: tuple[str, int, BatchResult, float, int]) -> tuple[str, tuple]:
            rel, seq, result, seconds, nbytes = done
            self.latency.update(int(seconds * 1000))
            self.requests.inc()
            self.records.inc(result.records)
            beam_progress.request_done(self.run_id, rel, 0 if result.failure else result.records, nbytes)
            return rel, Answer(seq, b"".join(result.pieces), result.records, result.dead, result.failure).wire()

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

        def process(self, element: tuple[str, Iterable[tuple | Tail]]) -> Iterator[str]:
            rel, parts = element[0], list(element[1])
            tails = [p for p in parts if isinstance(p, Tail)]
            answers = sorted((Answer.unwire(p) for p in parts if not isinstance(p, Tail)), key=lambda a: a.seq)
            if len(tails) != 1 or len(answers) != tails[0].requests:
                raise RuntimeError(f"{rel}: expected one tail and {tails[0].requests if tails else '?'} answers, "
                                   f"got {len(tails)} tails and {len(answers)} answers")
            outcome = self._write(tails[0], answers)
            (self.done if outcome.status == "done" else self.failed).inc()
            beam_progress.object_done(self.outcomes, tails[0].obj, outcome.status != "done")
            self.state.put(_outcome_name(self.outcomes, rel), _outcome_json(outcome))
            yield rel

        def _write(self, tail: Tail, answers: list[Answer]) -> ObjectOutcome:
            obj, store = tail.obj, self.store
            failure, records, dead = None, 0, []
            for answer in answers:
                if answer.failure is not None:
                    failure = answer.failure
                    break
                records += answer.records
                dead.extend(answer.dead)
            # a record that failed before reading stopped is the first reason, else the reader's
            failure = failure or tail.read_failure
            if failure is not None:
                return ObjectOutcome(obj, "failed", records, failure)
            writer = None
            try:
                writer = store.writer(obj.out_name)
                for answer in answers:
                    writer.write(answer.body)
                name = dead_letter_name(obj)
                if dead:
                    self.state.put(name, b"".join(d.to_json(obj) for d in dead))
                elif name in self.stale:
                    self.state.remove(name)
                writer.commit()
            except Exception as exc:
                if writer is not None:
                    try:
                        writer.abort()
                    except Exception:
                        pass
                error = f"could not write {store.display(obj.out_name)}: {type(exc).__name__}: {exc}"
                return ObjectOutcome(obj, "failed", records, RecordFailure("the object", error))
            return ObjectOutcome(obj, "done", records, None, len(dead))

    return CallModel, WriteObject


def _outcome_name(folder: str, rel: str) -> str:
    return f"{folder}/{hashlib.sha1(rel.encode()).hexdigest()}.json"


def _outcome_json(outcome: ObjectOutcome) -> bytes:
    failure = outcome.failure
    return orjson.dumps({
        "object": outcome.obj.rel,
        "status": outcome.status,
        "records": outcome.records,
        "dead_letters": outcome.dead_letters,
        "failure": None if failure is None else {"where": failure.where, "error": failure.error, "record": failure.record},
    })


def _read_outcome(store: OutputStore, folder: str, obj: InputObject) -> ObjectOutcome:
    try:
        doc = orjson.loads(store.get(_outcome_name(folder, obj.rel)))
    except FileNotFoundError:
        return ObjectOutcome(obj, "failed", 0, RecordFailure("the object", "the pipeline finished without writing it"))
    failure = doc["failure"]
    return ObjectOutcome(
        obj, doc["status"], doc["records"], RecordFailure(**failure) if failure else None, doc["dead_letters"]
    )


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

    started = time.monotonic()
    job = job.validated()
    flags = (beam_settings or BeamSettings()).flags()
    quiet_libraries("debug" if log.isEnabledFor(logging.DEBUG) else "info")  # Beam's lines would drown the job's
    objects = list_job_inputs(job)
    store, state = OutputStore(job.output), OutputStore(job.state_url)
    check_settings(state, job, job_description(job))  # changed flags stop the job before the bundle is read
    existing, todo, done = open_output(store, state, job, objects, bundle_versions([open_bundle(job.model, limits=archive_limits_from_env(os.environ))]))
    summary = TransformSummary(objects=len(objects), skipped=len(done))
    if todo:
        folder = f"{OUTCOMES_PREFIX}{uuid.uuid4().hex[:12]}"
        stale = {dead_letter_name(o) for o in todo} & existing
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
                    | "write" >> beam.ParDo(WriteObject(job, stale, folder))
                )
            beam_progress.log_counters(pipeline.result, METRICS, progress)
            outcomes = [_read_outcome(state, folder, obj) for obj in todo]
        finally:
            release_services()
            _remove_folder(state, folder)
        for outcome in outcomes:
            summary.add(outcome)
    summary.seconds = time.monotonic() - started
    summary.report = write_report(state, job, summary)
    return summary


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
