"""The transform job on Spark (`tfservo transform --runner spark`).

The same steps as the Beam pipeline, as RDD stages: the objects not done yet are split into
requests where they are read, each Python worker holds one loaded ModelService (Spark reuses
its Python workers, so the model is loaded once per worker process) and answers its partition
--max-concurrent-transforms at a time, and each object's answers are put in order and written
atomically (distributed.write_object). With at least two objects per worker, a task takes
whole objects and runs them through the local engine's threads from reading to writing
(distributed.transform_objects), and nothing is shuffled; with fewer, the requests are
repartitioned across the workers (one object's requests spread over all of them) and the
answers grouped per object again. Without a master URL it runs on local[N], this machine's cores.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tfservo.batch.engines.distributed import (
    Request,
    Tail,
    call_request,
    on_cores,
    outcome_from_json,
    outcome_json,
    run_on_cluster,
    split_object,
    takes_whole_objects,
    transform_objects,
    worker_id,
    worker_service,
    write_wired,
)
from tfservo.batch.engines.driver import DriverRun
from tfservo.batch.job import JobError, TransformJob
from tfservo.batch.records import Wire
from tfservo.batch.sources import InputObject
from tfservo.batch.state import ObjectOutcome, TransformSummary
from tfservo.core import environment
from tfservo.core.extras import require
from tfservo.core.logs import library_logs_wanted

__all__ = ["SparkSettings", "run_spark_transform"]

log = logging.getLogger("tfservo.batch")

_QUIET_LOG4J = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark-log4j2.properties")


@dataclass
class SparkSettings:
    """--spark-master and --workers: where the job runs and how many partitions of requests."""

    master: str | None = None  # None: the active SparkSession, else local[N] on this machine's cores
    workers: int = 0  # parallel model workers; 0: Spark's default parallelism
    conf: dict[str, str] = field(default_factory=dict)  # more Spark settings


@contextmanager
def _session(settings: SparkSettings) -> Iterator[object]:
    """A SparkSession: the active one (left running), or a new one on `master` (stopped at the end)."""
    SparkSession = require("--runner spark", "spark", "pyspark.sql").SparkSession
    active = SparkSession.getActiveSession()
    if active is not None and settings.master is None:
        yield active
        return
    defaults = {
        "spark.ui.enabled": "false",
        "spark.python.worker.reuse": "true",  # the model stays loaded between tasks
        "spark.ui.showConsoleProgress": "false",
    }
    master = settings.master or f"local[{os.cpu_count() or 1}]"
    if not library_logs_wanted():  # the driver's start-up notes off, as TensorFlow's are (a
        # cluster's executors keep their own configuration: the file is on this machine only)
        defaults["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{_QUIET_LOG4J}"
    # Python workers run this interpreter (tfservo installed); PySpark reads only the variable.
    environment.export_missing({"PYSPARK_PYTHON": sys.executable})
    builder = SparkSession.builder.appName("tfservo transform").master(master)
    for key, value in {**defaults, **settings.conf}.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # Py4J/Java startup errors carry their own types
        raise JobError(f"cannot start Spark on {settings.master or 'local'}: {type(exc).__name__}: {exc}") from None
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


def run_spark_transform(
    job: TransformJob, settings: SparkSettings | None = None, *, progress: str = "auto",
    progress_interval: float = 10.0,
) -> TransformSummary:
    """Run `job` on Spark and wait for it: the local engine's outputs, report and summary, with
    the workers that took part named in the summary."""
    chosen = settings or SparkSettings()
    return run_on_cluster(
        job, lambda: _session(chosen), lambda engine, run: _drive(engine, run, chosen, progress, progress_interval)
    )


def _drive(
    spark: Any, run: DriverRun, settings: SparkSettings, progress_mode: str, interval: float
) -> tuple[list[ObjectOutcome], set[str]]:
    from pyspark.accumulators import AccumulatorParam

    class _Union(AccumulatorParam[set[str]]):
        def zero(self, value: set[str]) -> set[str]:
            return set()

        def addInPlace(self, a: set[str], b: set[str]) -> set[str]:
            a |= b
            return a

    sc = spark.sparkContext
    job = run.job
    parallel = settings.workers or sc.defaultParallelism
    records, nbytes, seen = sc.accumulator(0), sc.accumulator(0), sc.accumulator(set(), _Union())
    stale = run.stale_dead_letters
    whole = takes_whole_objects(len(run.todo), parallel)
    log.info("running %d objects on Spark (%s, %d parallel model workers, %s)", len(run.todo), sc.master, parallel,
             "whole objects in each task" if whole else "each object's requests spread over the workers")
    meter = run.progress(progress_mode, interval)
    stop = threading.Event()

    def follow() -> None:  # accumulators reach the driver as tasks finish
        counted = [0, 0]
        while not stop.wait(min(interval, 2.0)):
            r, b = records.value, nbytes.value
            meter.add(records=r - counted[0], nbytes=b - counted[1])
            counted[:] = [r, b]

    follower = threading.Thread(target=follow, daemon=True, name="tfservo-spark-progress")
    follower.start()
    try:
        if whole:
            # four tasks per worker, not one per object (a PySpark task costs tens of milliseconds)
            objects = sc.parallelize(run.todo, min(len(run.todo), 4 * parallel))
            written = objects.mapPartitions(lambda objs: _transform_partition(job, stale, objs, records, nbytes, seen))
        else:
            requests = sc.parallelize(run.todo, len(run.todo)).flatMap(lambda obj: split_object(obj, job))
            requests = requests.repartition(max(parallel * 2, 1))  # one object's requests over all workers
            answers = requests.mapPartitions(lambda parts: _call_partition(job, parts, records, nbytes, seen))
            written = answers.groupByKey(max(parallel, 1)).map(lambda grouped: _write(job, stale, grouped))
        results = written.collect()
    except Exception as exc:  # Py4JJavaError and friends: the job did not finish
        raise JobError(f"the Spark job failed: {type(exc).__name__}: {str(exc)[:2000]}; "
                       "run the same command again to resume") from None
    finally:
        stop.set()
        follower.join(timeout=5)
        meter.close()
    by_rel = {obj.rel: obj for obj in run.todo}
    outcomes = [outcome_from_json(by_rel[rel], data) for rel, data in results]
    for outcome in outcomes:
        meter.add(objects=1, failed=int(outcome.status != "done"))
    return outcomes, set(seen.value)


def _call_partition(
    job: TransformJob, parts: Iterable[tuple[str, Wire | Tail]], records: Any, nbytes: Any, seen: Any
) -> Iterator[tuple[str, Wire | Tail]]:
    """One partition's requests through this Python worker's model, --max-concurrent-transforms
    at a time; answers and Tails come out in the order their requests and Tails came in."""
    cores = _task_cores()
    job = on_cores(job, cores)
    invoker = worker_service(job, cores).invoker
    seen.add({worker_id()})
    pending: list[Future[tuple[str, Wire | Tail]]] = []

    def call(rel: str, part: Request) -> tuple[str, Wire]:
        answer = call_request(invoker, job, rel, part)
        records.add(answer.records if answer.failure is None else 0)
        nbytes.add(part.nbytes)
        return rel, answer.wire()

    with ThreadPoolExecutor(job.concurrency, thread_name_prefix="tfservo-spark-model") as pool:
        for rel, wire in parts:
            if isinstance(wire, Tail):
                passed: Future[tuple[str, Wire | Tail]] = Future()
                passed.set_result((rel, wire))
                pending.append(passed)
            else:
                pending.append(pool.submit(call, rel, Request.unwire(wire)))
            while pending and (pending[0].done() or len(pending) > 2 * job.concurrency):
                yield pending.pop(0).result()
        while pending:
            yield pending.pop(0).result()


def _transform_partition(
    job: TransformJob, stale: set[str], objects: Iterable[InputObject], records: Any, nbytes: Any, seen: Any
) -> Iterator[tuple[str, bytes]]:
    """A partition of whole objects through this Python worker's model, read to written."""
    share = list(objects)
    seen.add({worker_id()})
    for obj, outcome in zip(share, transform_objects(job, share, stale, _task_cores())):
        records.add(outcome.records)
        nbytes.add(obj.size or 0)
        yield obj.rel, outcome_json(outcome)


def _task_cores() -> int | None:
    """The CPUs Spark gives this task (spark.task.cpus): the model's share of the machine."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.cpus() if context is not None else None


def _write(job: TransformJob, stale: set[str], grouped: tuple[str, Iterable[Wire | Tail]]) -> tuple[str, bytes]:
    """One object's answers → its .out (distributed.write_object) → its outcome as JSON."""
    rel, parts = grouped[0], list(grouped[1])
    tails = [p for p in parts if isinstance(p, Tail)]
    answers = [p for p in parts if not isinstance(p, Tail)]
    if len(tails) != 1:
        raise RuntimeError(f"{rel}: expected one tail, got {len(tails)}")
    return rel, write_wired(job, tails[0], answers, stale)
