"""What every distributed transform engine (Beam, Ray, Spark) shares: an object split into
requests, a request answered by the worker's model, an object's answers written as its .out.

Each engine only moves these between its workers: `split_object` where the input is read,
`call_request` in a worker holding the model (`worker_service`, loaded once per process),
`write_object` where the answers of one object meet. With objects enough to keep every worker
busy (`takes_whole_objects`), a worker runs the local engine on its share instead
(`transform_objects`): nothing crosses between workers but the objects' names and outcomes.
So the .out files, dead letters and failures are the local engine's, byte for byte, whatever
engine ran them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import orjson

from tfservo.batch.calls import BatchCaller, BatchResult
from tfservo.batch.capture import capture_writer
from tfservo.batch.columnar import ColumnBatch
from tfservo.batch.engines.driver import DriverRun, publish, start_driver_run
from tfservo.batch.engines.local import TransformEngine, failure_from, object_format, object_requests
from tfservo.batch.job import TransformJob
from tfservo.batch.joiner import DataProcessing
from tfservo.batch.progress import Progress
from tfservo.batch.records import RecordBatch, Wire, where
from tfservo.batch.sinks import OutputStore
from tfservo.batch.sources import InputObject, OpenedInput
from tfservo.batch.state import (
    DeadLetter,
    ObjectOutcome,
    RecordFailure,
    TransformSummary,
)
from tfservo.batch.worker.once import load_once, release_loaded
from tfservo.core import tracing
from tfservo.core.logs import quiet_libraries

__all__ = [
    "Answer",
    "Request",
    "Tail",
    "call_request",
    "outcome_from_json",
    "outcome_json",
    "outcome_name",
    "release_services",
    "on_cores",
    "run_on_cluster",
    "split_object",
    "takes_whole_objects",
    "transform_objects",
    "worker_id",
    "worker_service",
    "write_object",
    "write_wired",
]

log = logging.getLogger("tfservo.batch")


# Requests and answers cross the shuffles as tuples of bytes, ints and strings, which Beam's
# coder writes natively; as dataclasses they went through pickle, 7x slower end to end.


@dataclass(frozen=True)
class Request:
    """One request of an object: its place in the object's order and the records it carries."""

    seq: int
    content_type: str
    record_format: str | None
    batch: RecordBatch | ColumnBatch

    @property
    def nbytes(self) -> int:
        """Bytes of the (decompressed) object its records span, for progress."""
        return self.batch.nbytes

    def wire(self) -> Wire:
        return ("q", self.seq, self.content_type, self.record_format, self.batch.wire())

    @staticmethod
    def unwire(wire: Wire) -> Request:
        _, seq, content_type, fmt, batch = wire
        return Request(seq, content_type, fmt, ColumnBatch.unwire(batch) if batch[0] == "c" else RecordBatch.unwire(batch))


@dataclass(frozen=True)
class Answer:
    """What one request added to its object's output: its pieces joined in order."""

    seq: int
    body: bytes
    records: int
    dead: list[DeadLetter]
    failure: RecordFailure | None
    capture: bytes = b""  # --data-capture: its capture lines

    def wire(self) -> Wire:
        dead = [(d.where, d.index, d.data, d.error) for d in self.dead]
        failure = None if self.failure is None else (self.failure.where, self.failure.error, self.failure.record)
        return ("a", self.seq, self.body, self.records, dead, failure, self.capture)

    @staticmethod
    def unwire(wire: Wire) -> Answer:
        _, seq, body, records, dead, failure, capture = wire
        return Answer(seq, body, records, [DeadLetter(*d) for d in dead],
                      None if failure is None else RecordFailure(*failure), capture)


@dataclass(frozen=True)
class Tail:
    """The end of one object's requests: how many there are and whether reading it failed."""

    obj: InputObject
    requests: int
    read_complete: bool
    read_failure: RecordFailure | None = None


def split_object(obj: InputObject, job: TransformJob) -> Iterator[tuple[str, Wire | Tail]]:
    """(object name, request) for each request of `obj`, then its Tail; never raises for bad input."""
    seq = 0
    try:
        content_type, fmt = object_format(job, obj)
        processing = _processing(job, fmt)
        opened = OpenedInput(obj, job.compression_type)
        try:
            for batch in object_requests(opened, job, processing, columns=True):
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

@dataclass
class _WorkerService:
    """A job's model service in a worker, with the loopback server its handlers call."""

    service: Any
    loopback: Any

    def close(self) -> None:
        if self.loopback is not None:
            self.loopback.stop()
        self.service.close()


def on_cores(job: TransformJob, cores: int | None) -> TransformJob:
    """The job as a worker owning `cores` CPUs runs it: that many model calls at a time, unless
    --max-concurrent-transforms says (os.cpu_count() is the whole machine's, shared with the
    other workers on it)."""
    if not cores or job.max_concurrent_transforms:
        return job
    return dataclasses.replace(job, max_concurrent_transforms=cores)


def worker_service(job: TransformJob, cores: int | None = None) -> Any:
    """The job's ModelService in this process, loaded once (with --env applied, and a loopback
    server when the bundle has handlers, as `transform` and `serve` do); `cores`: the CPUs this
    worker owns, its TensorFlow intra-op threads unless the job's environment sets them (a
    thread per core of the machine in every worker ran twice the threads there are cores)."""
    from tfservo.batch.loading import apply_env, load_service
    from tfservo.server.loopback import start_handler_endpoints

    def load() -> _WorkerService:
        quiet_libraries()  # a worker in another process: TF's and Beam's noise off there too
        apply_env(job.env)
        started = time.monotonic()
        service = load_service(job.model, job.env, cores=cores)
        loopback = start_handler_endpoints(service)
        log.info("loaded %s in %.1fs in worker process %d", job.model, time.monotonic() - started, os.getpid())
        return _WorkerService(service, loopback)

    return load_once(("transform", job.model, tuple(sorted(job.env.items())), cores), load).service


def release_services() -> None:
    """Close the services this process loaded (the driver, after an in-process runner)."""
    release_loaded()


def worker_id() -> str:
    """This worker process, as the job's summary names it: host:pid."""
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def call_request(invoker: Any, job: TransformJob, rel: str, part: Request) -> Answer:
    """One request of object `rel` through the worker's /invocations path, as its Answer; a bug
    of ours fails the object (logged), never the job."""
    caller = BatchCaller(invoker, job, _processing(job, part.record_format), part.content_type, rel)
    try:
        with tracing.activate(tracing.from_traceparent(job.trace_parent)):
            result = caller.run(part.batch)
    except Exception as exc:
        log.exception("transforming %s failed", rel)
        result = BatchResult(failure=RecordFailure(
            where(part.batch.record(0), job.split_type), f"internal error: {type(exc).__name__}: {exc}"
        ))
    return Answer(part.seq, b"".join(result.pieces), result.records, result.dead, result.failure, b"".join(result.capture))


def write_object(
    job: TransformJob, store: OutputStore, state: OutputStore, tail: Tail, answers: Iterable[Answer],
    stale_dead_letters: set[str],
) -> ObjectOutcome:
    """Put one object's answers in order and publish its .out atomically (or nothing, when a
    record failed), with its dead letters in the state location."""
    obj = tail.obj
    ordered = sorted(answers, key=lambda a: a.seq)
    if len(ordered) != tail.requests:
        error = f"internal error: {tail.requests} requests but {len(ordered)} answers"
        return ObjectOutcome(obj, "failed", 0, RecordFailure("the object", error))
    failure, records, dead = None, 0, []
    for answer in ordered:
        if answer.failure is not None:
            failure = answer.failure
            break
        records += answer.records
        dead.extend(answer.dead)
    # a record that failed before reading stopped is the first reason, else the reader's
    failure = failure or tail.read_failure
    if failure is not None:
        return ObjectOutcome(obj, "failed", records, failure)
    writer = capture = None
    try:
        writer = store.writer(obj.out_name)
        capture = capture_writer(job, obj)
        for answer in ordered:
            writer.write(answer.body)
            if capture is not None:
                capture.write(answer.capture)
    except Exception as exc:
        return publish(store, state, obj, writer, records, dead, stale_dead_letters, error=exc, capture=capture)
    return publish(store, state, obj, writer, records, dead, stale_dead_letters, capture=capture)


def write_wired(job: TransformJob, tail: Tail, answers: Iterable[Wire], stale_dead_letters: set[str]) -> bytes:
    """write_object for a worker that got the answers as wire tuples; the outcome as JSON."""
    store, state = OutputStore(job.output), OutputStore(job.state_url)
    outcome = write_object(job, store, state, tail, [Answer.unwire(a) for a in answers], stale_dead_letters)
    return outcome_json(outcome)


def takes_whole_objects(objects: int, workers: int) -> bool:
    """Whether each worker should take whole objects from reading to writing: with two objects
    or more per worker, every worker stays busy without one object's requests crossing to
    another (a large object alone is split across all of them instead)."""
    return objects >= 2 * max(workers, 1)


def transform_objects(
    job: TransformJob, objects: list[InputObject], stale_dead_letters: set[str], cores: int | None = None
) -> list[ObjectOutcome]:
    """Whole objects from reading to publishing in this worker (owning `cores` CPUs): the local
    engine's threads around the worker's loaded model, its outcomes for the driver."""
    job = on_cores(job, cores)
    engine = TransformEngine(job, worker_service(job, cores).invoker, progress="none")
    progress = Progress(len(objects), None, mode="none")
    return engine.transform(objects, OutputStore(job.output), OutputStore(job.state_url), stale_dead_letters,
                            tracing.from_traceparent(job.trace_parent), progress)


def outcome_name(folder: str, rel: str) -> str:
    """Where an engine whose driver cannot collect outcomes leaves the one of `rel`."""
    return f"{folder}/{hashlib.sha1(rel.encode()).hexdigest()}.json"


def outcome_json(outcome: ObjectOutcome) -> bytes:
    failure = outcome.failure
    return orjson.dumps({
        "object": outcome.obj.rel,
        "status": outcome.status,
        "records": outcome.records,
        "dead_letters": outcome.dead_letters,
        "failure": None if failure is None else {"where": failure.where, "error": failure.error, "record": failure.record},
    })


def outcome_from_json(obj: InputObject, data: bytes) -> ObjectOutcome:
    doc = orjson.loads(data)
    failure = doc["failure"]
    return ObjectOutcome(
        obj, doc["status"], doc["records"], RecordFailure(**failure) if failure else None, doc["dead_letters"]
    )


Drive = Callable[[Any, DriverRun], tuple[list[ObjectOutcome], set[str]]]


def run_on_cluster(job: TransformJob, connect: Callable[[], AbstractContextManager[object]], drive: Drive) -> TransformSummary:
    """Ray's and Spark's run: prepare OUTPUT, connect to the cluster only when there is work,
    let the engine `drive` the objects, then count, name the workers and report."""
    run = start_driver_run(job)
    if not run.todo:
        return run.finish([])
    with connect() as engine:
        outcomes, workers = drive(engine, run)
    return run.finish(outcomes, workers)
