"""Progress of `transform --runner beam` (`--progress`): live where the workers are this process.

The DirectRunner (in_memory or multi_threading) runs every DoFn in the driver's process, so the
DoFns add to the local engine's Progress (a bar on a terminal, a log line every 10 s otherwise)
through the per-run registry here. Workers in other processes or machines (multi_processing,
Dataflow, Flink, Spark) cannot reach it; there the runner's own UI shows progress. Either way
the driver logs Beam's metric counters of the run when the pipeline ends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tfservo.batch.job import TransformJob
from tfservo.batch.progress import Progress
from tfservo.batch.sources import InputObject

__all__ = [
    "IN_PROCESS_RUNNERS",
    "live_progress",
    "log_counters",
    "object_done",
    "request_done",
    "workers_in_process",
]

log = logging.getLogger("tfservo.batch")

IN_PROCESS_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")

class _LiveRun:
    """One run's Progress and the bytes counted per object so far (its rest comes when it is done)."""

    def __init__(self, progress: Progress, by_bytes: bool) -> None:
        self.progress = progress
        self.by_bytes = by_bytes
        self.counted: dict[str, int] = {}
        self.lock = threading.Lock()


_live: dict[str, _LiveRun] = {}
_lock = threading.Lock()


def workers_in_process(flags: Sequence[str]) -> bool:
    """Whether Beam runs the pipeline's DoFns in this process (DirectRunner, not multi_processing)."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

    options = PipelineOptions(list(flags))
    mode = options.view_as(DirectOptions).direct_running_mode
    return options.view_as(StandardOptions).runner in IN_PROCESS_RUNNERS and mode != "multi_processing"


@contextmanager
def live_progress(
    run_id: str,
    objects: Sequence[InputObject],
    job: TransformJob,
    flags: Sequence[str],
    mode: str,
    interval: float = 10.0,
) -> Iterator[None]:
    """Show the run's progress while the block runs, fed by request_done / object_done."""
    if mode == "none":
        yield
        return
    if not workers_in_process(flags):
        runner = next((f.split("=", 1)[1] for f in flags if f.startswith("--runner=")), "the runner")
        (log.info if mode == "auto" else log.warning)(
            "progress: %s runs the workers outside this process, so there is no live progress here; "
            "follow the runner's own monitoring (Beam's counters are logged at the end)", runner,
        )
        yield
        return
    # An ETA from bytes, as the local engine's; requests count the decompressed bytes their
    # records span, which gzip objects' sizes do not measure: their ETA comes from objects.
    sized = job.compression_type == "None" and all(o.size is not None for o in objects)
    total_bytes = sum(o.size or 0 for o in objects) if sized else None
    progress = Progress(len(objects), total_bytes, mode=mode, interval=interval)
    with _lock:
        _live[run_id] = _LiveRun(progress, sized)
    try:
        yield
    finally:
        with _lock:
            del _live[run_id]
        progress.close()
        if progress.mode == "log":
            log.info("progress: %s", progress.status())


def request_done(run_id: str, rel: str, records: int, nbytes: int) -> None:
    """A request of object `rel` answered; a no-op in a process that shows no progress for the run."""
    run = _live.get(run_id)
    if run is not None:
        with run.lock:
            run.counted[rel] = run.counted.get(rel, 0) + nbytes
        run.progress.add(records=records, nbytes=nbytes)


def object_done(run_id: str, obj: InputObject, failed: bool) -> None:
    """Object `obj` finished (written or failed): it counts whole, bytes its requests missed too."""
    run = _live.get(run_id)
    if run is not None:
        with run.lock:
            rest = (obj.size or 0) - run.counted.pop(obj.rel, 0) if run.by_bytes else 0
        run.progress.add(objects=1, failed=int(failed), nbytes=max(rest, 0))


def log_counters(result: object, namespace: str, mode: str) -> None:
    """Log Beam's counters of a finished run (unless --progress none)."""
    if mode == "none":
        return
    line = _counters_line(result, namespace)
    if line is not None:
        log.info("%s", line)


def _counters_line(result: Any, namespace: str) -> str | None:
    """Beam's counters of a finished run (objects, requests, records, request latency), or None
    when the runner reports none."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        metrics = result.metrics().query(MetricsFilter().with_namespace(namespace))
    except Exception as exc:
        log.debug("no Beam metrics from %s: %s", type(result).__name__, exc)
        return None
    totals: dict[str, int] = {}
    for counter in metrics["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + (value or 0)
    if not totals:
        return None
    done, failed = totals.get("objects_done", 0), totals.get("objects_failed", 0)
    line = (
        f"Beam counters: {done + failed} objects{f' ({failed} failed)' if failed else ''}, "
        f"{totals.get('requests', 0)} requests, {totals.get('records', 0)} records answered"
    )
    latencies = [d.committed or d.attempted for d in metrics["distributions"]]
    latencies = [d for d in latencies if d is not None and d.count]
    if latencies:
        count = sum(d.count for d in latencies)
        line += (
            f"; request latency mean {sum(d.sum for d in latencies) / count:.0f} ms, "
            f"max {max(d.max for d in latencies)} ms"
        )
    return line
