"""The driver's steps every transform engine shares: start a run (validate, list INPUT, check
the settings against an earlier run's, prepare OUTPUT), publish an object (dead letters, then
its .out committed, or aborted on failure), and finish (count, name the workers, report).

The local engine runs them with threads between start and finish; Beam, Ray and Spark run the
steps of engines.distributed between them on their workers.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tfservo.batch.job import TransformJob
from tfservo.batch.progress import Progress
from tfservo.batch.sinks import ObjectWriter, OutputStore
from tfservo.batch.sources import InputObject
from tfservo.batch.state import (
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
from tfservo.core import tracing

__all__ = ["DriverRun", "job_bundle_versions", "publish", "start_driver_run"]


@dataclass
class DriverRun:
    """One run of a job as a distributed engine's driver sees it: what to do, and the summary."""

    job: TransformJob
    store: OutputStore
    state: OutputStore
    todo: list[InputObject]
    stale_dead_letters: set[str]
    summary: TransformSummary
    started: float = field(default_factory=time.monotonic)
    span: Any = None  # the job's trace span (tracing on), ended by finish

    @property
    def trace(self) -> tracing.Parent:
        """The job span's context: objects' and requests' spans go under it."""
        return tracing.context_of(self.span)

    def progress(self, mode: str, interval: float) -> Progress:
        """The run's progress display (by bytes when every object's size is known)."""
        sizes = [o.size for o in self.todo]
        return Progress(len(self.todo), sum(s for s in sizes if s) if all(sizes) else None, mode=mode, interval=interval)

    def finish(self, outcomes: Iterable[ObjectOutcome], workers: Iterable[str] = ()) -> TransformSummary:
        """Count the outcomes (an object without one failed), name the workers that took part,
        write the failure report, and remove partial files whose writer has gone since the start:
        a killed run's workers (Ray actors of a dead driver) may still have been writing then."""
        self.store.clean_partials()
        self.state.clean_partials()
        outcomes = list(outcomes)
        seen = {o.obj.rel for o in outcomes}
        outcomes += [ObjectOutcome(obj, "failed", 0, RecordFailure("the object", "the run ended without it"))
                     for obj in self.todo if obj.rel not in seen]
        for outcome in outcomes:
            self.summary.add(outcome)
        self.summary.workers = sorted(set(workers))
        self.summary.seconds = time.monotonic() - self.started
        self.summary.report = write_report(self.state, self.job, self.summary)
        if self.span is not None:
            self.span.set_attributes({"tfservo.transform.objects_done": self.summary.done,
                                      "tfservo.transform.objects_failed": len(self.summary.failed)})
            tracing.end(self.span, None if self.summary.ok else f"{len(self.summary.failed)} objects failed")
            tracing.flush()
        return self.summary


def start_driver_run(
    job: TransformJob,
    objects: list[InputObject] | None = None,
    versions: dict[str, list[int]] | None = None,
    *,
    read_versions: bool = True,
) -> DriverRun:
    """Validate the job, list INPUT (unless `objects` are given), check the settings against an
    earlier run's and prepare OUTPUT, before any worker starts: every engine's start. `versions`:
    the bundle's, when the caller has it loaded (else, with `read_versions`, the bundle is
    opened to read them)."""
    from tfservo.batch.engines.local import list_job_inputs

    started, started_ns = time.monotonic(), tracing.now_ns()
    job = job.validated()
    if objects is None:
        objects = list_job_inputs(job)
    store, state = OutputStore(job.output), OutputStore(job.state_url)
    check_settings(state, job, job_description(job))  # changed flags stop the job before the bundle is read
    if versions is None and read_versions:
        versions = job_bundle_versions(job)
    existing, todo, done = open_output(store, state, job, objects, versions)
    summary = TransformSummary(objects=len(objects), skipped=len(done))
    stale = {dead_letter_name(o) for o in todo} & existing
    tracing.configure()
    span = tracing.start("transform", attributes={
        "tfservo.transform.model": job.model, "tfservo.transform.input": job.input, "tfservo.transform.output": job.output,
        "tfservo.transform.objects": len(objects), "tfservo.transform.objects_todo": len(todo),
    }, start_ns=started_ns)
    job = dataclasses.replace(job, trace_parent=tracing.traceparent(tracing.context_of(span)))
    return DriverRun(job, store, state, todo, stale, summary, started, span)


def job_bundle_versions(job: TransformJob) -> dict[str, list[int]]:
    """The versions of each model of the job's bundle, read without loading it (a driver's view)."""
    from tfservo.core.pipeline_file import container_paths
    from tfservo.core.settings import archive_limits_from_env, environment
    from tfservo.models.bundle import open_bundle

    limits = archive_limits_from_env(environment(job.env))
    paths = container_paths(job.model)  # a pipeline file: each container's
    return bundle_versions([open_bundle(p, limits=limits, code_only=len(paths) > 1) for p in paths])


def publish(
    store: OutputStore, state: OutputStore, obj: InputObject, writer: ObjectWriter | None, records: int,
    dead: list[DeadLetter], stale_dead_letters: set[str], *, failure: RecordFailure | None = None,
    error: BaseException | None = None, capture: ObjectWriter | None = None,
) -> ObjectOutcome:
    """An object's end, for every engine: with no failure, its dead letters in the state location
    (an earlier run's removed), its capture file (--data-capture) and then its .out committed;
    else (a record's failure, or `error` writing it) the partial output and capture aborted.
    Nothing half-written is ever published."""
    if failure is None and error is None:
        try:
            assert writer is not None
            name = dead_letter_name(obj)
            if dead:
                state.put(name, b"".join(d.to_json(obj) for d in dead))
            elif name in stale_dead_letters:
                state.remove(name)
            if capture is not None:  # first: an object whose .out exists has its capture
                capture.commit()
            writer.commit()
            return ObjectOutcome(obj, "done", records, None, len(dead))
        except Exception as exc:
            error = exc
    for partial in (writer, capture):
        if partial is not None:
            try:
                partial.abort()
            except Exception:
                pass
    if error is not None:
        failure = RecordFailure("the object", f"could not write {store.display(obj.out_name)}: {type(error).__name__}: {error}")
    return ObjectOutcome(obj, "failed", records, failure)
