"""The local transform engine: one loaded model, reads, model calls and writes overlapping.

Reader threads open objects and cut them into requests; a pool of --max-concurrent-transforms
threads sends them through `Invoker.invoke` (the /invocations path); each object's answers
are written in order as they arrive, so one large object keeps every worker busy; a writer
pool publishes finished objects. Requests in flight and objects open at once are bounded.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tfservo.batch.calls import BatchCaller, BatchResult
from tfservo.batch.capture import capture_writer
from tfservo.batch.columnar import ColumnBatch, column_batches, columns_apply
from tfservo.batch.engines.driver import publish, start_driver_run
from tfservo.batch.job import JobError, TransformJob, record_format
from tfservo.batch.joiner import DataProcessing
from tfservo.batch.progress import Progress
from tfservo.batch.records import (
    RecordBatch,
    RecordChunk,
    RecordError,
    blank_test,
    iter_record_chunks,
    iter_text_blocks,
    pack_batches,
    where,
)
from tfservo.batch.sinks import ObjectWriter, OutputStore
from tfservo.batch.sources import (
    InputObject,
    OpenedInput,
    guess_content_type,
    gzip_error,
    list_inputs,
)
from tfservo.batch.state import (
    DeadLetter,
    ObjectOutcome,
    RecordFailure,
    TransformSummary,
)
from tfservo.codecs.media_types import JSON, X_IMAGE
from tfservo.core import tracing
from tfservo.core.errors import ServingError
from tfservo.service.invocation import Invoker
from tfservo.storage.urls import is_local, url_to_fs

__all__ = [
    "WRITERS",
    "check_output_outside_input",
    "failure_from",
    "list_job_inputs",
    "object_format",
    "object_requests",
    "request_batches",
    "TransformEngine",
]

log = logging.getLogger("tfservo.batch")

WRITERS = 4


class TransformEngine:
    """Runs one TransformJob on this machine through an Invoker."""

    def __init__(
        self,
        job: TransformJob,
        invoker: Invoker,
        *,
        progress: str = "auto",
        progress_interval: float = 10.0,
        versions: dict[str, list[int]] | None = None,
        columns: bool = True,
    ) -> None:
        self.job = job.validated()
        self.columns = columns  # plain CSV records as Arrow columns (batch.columnar) where the job allows
        self.invoker = invoker
        self.versions = versions  # the bundle's, for the job's description in OUTPUT
        self.progress_mode = progress
        self.progress_interval = progress_interval
        self.stopping = threading.Event()
        self._processing: dict[str | None, DataProcessing] = {}

    def run(self, objects: list[InputObject] | None = None) -> TransformSummary:
        """Transform every object not done yet (listing INPUT unless `objects` are given): the
        driver's start and end every engine shares, with this machine's threads in between."""
        run = start_driver_run(self.job, objects, self.versions, read_versions=False)
        progress = run.progress(self.progress_mode, self.progress_interval)
        try:
            outcomes = self.transform(run.todo, run.store, run.state, run.stale_dead_letters, run.trace, progress)
        finally:
            progress.close()
        return run.finish(outcomes)

    def transform(
        self, todo: list[InputObject], store: OutputStore, state: OutputStore, stale_dead_letters: set[str],
        trace: tracing.Parent, progress: Progress,
    ) -> list[ObjectOutcome]:
        """Read, answer and publish `todo` with this machine's threads, between a driver's start
        and finish (this engine's own run, or a cluster worker's share of objects)."""
        self.state, self.stale_dead_letters, self.trace = state, stale_dead_letters, trace
        n = self.job.concurrency
        readers = min(16, max(2, n))
        self.model_pool = ThreadPoolExecutor(n, thread_name_prefix="tfservo-model")
        self.write_pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="tfservo-write")
        self.batch_slots = threading.Semaphore(2 * n)
        self.object_slots = threading.Semaphore(readers + 2 * n + WRITERS)
        self.store, self.progress = store, progress
        runs = [_ObjectRun(self, obj) for obj in todo]
        read_pool = ThreadPoolExecutor(readers, thread_name_prefix="tfservo-read")
        try:
            for run in runs:
                read_pool.submit(run.read)
            for run in runs:
                while not run.finished.wait(0.2):
                    pass
        except KeyboardInterrupt:
            self.stopping.set()
            log.warning("interrupted: finishing requests in flight and removing partial outputs")
            read_pool.shutdown(wait=True, cancel_futures=True)
            self.model_pool.shutdown(wait=True)
            self.write_pool.shutdown(wait=True)
            raise
        finally:
            read_pool.shutdown(wait=True)
            self.model_pool.shutdown(wait=True)
            self.write_pool.shutdown(wait=True)
        return [run.outcome for run in runs]

    def processing(self, fmt: str | None) -> DataProcessing:
        if fmt not in self._processing:
            self._processing[fmt] = DataProcessing(
                fmt,
                self.job.input_filter_path,
                self.job.output_filter_path,
                self.job.join_source == "Input",
            )
        return self._processing[fmt]


class _ObjectRun:
    """One object on its way through the engine: batches out, answers back in order."""

    def __init__(self, engine: TransformEngine, obj: InputObject) -> None:
        self.engine = engine
        self.obj = obj
        self.lock = threading.Lock()
        self.pending: dict[int, BatchResult] = {}
        self.next = 0
        self.submitted = 0
        self.read_done = False
        self.read_complete = False
        self.finishing = False
        self.failure: RecordFailure | None = None  # the first record that failed, in order
        self.read_failure: RecordFailure | None = None  # the object could not be read to the end
        self.dead: list[DeadLetter] = []
        self.records = 0
        self.writer: ObjectWriter | None = None
        self.holds_slot = False
        self.capture: ObjectWriter | None = None  # --data-capture: the object's capture file
        self.span: Any = None  # the object's trace span (tracing on)
        self.finished = threading.Event()
        self.outcome = ObjectOutcome(obj, "failed")

    # -- reading (a reader thread) -----------------------------------------------------------

    def read(self) -> None:
        engine, job, obj = self.engine, self.engine.job, self.obj
        try:
            if engine.stopping.is_set():
                return
            engine.object_slots.acquire()
            self.holds_slot = True
            self.span = tracing.start("object", engine.trace, {"tfservo.transform.object": obj.rel})
            content_type, fmt = object_format(job, obj)
            processing = engine.processing(fmt)
            caller = BatchCaller(engine.invoker, job, processing, content_type, obj.rel)
            try:
                self.writer = engine.store.writer(obj.out_name)
                self.capture = capture_writer(job, obj)
            except OSError as exc:
                raise _WriteError(
                    f"cannot write {engine.store.display(obj.out_name)} or its capture: {type(exc).__name__}: {exc}"
                ) from None
            self._submit_batches(caller, processing)
        except Exception as exc:
            self._fail(failure_from(exc, self.obj))
        finally:
            with self.lock:
                self.read_done = True
                self._maybe_finish()

    def _submit_batches(self, caller: BatchCaller, processing: DataProcessing) -> None:
        engine, job = self.engine, self.engine.job
        opened = OpenedInput(self.obj, job.compression_type)
        seen = 0
        try:
            for batch in object_requests(opened, job, processing, engine.columns):
                if self.failure is not None or self.read_failure is not None or engine.stopping.is_set():
                    return
                consumed = opened.consumed
                engine.progress.add(nbytes=consumed - seen)
                seen = consumed
                engine.batch_slots.acquire()
                with self.lock:
                    seq = self.submitted
                    self.submitted += 1
                try:
                    engine.model_pool.submit(self._call, seq, caller, batch)
                except RuntimeError:  # the pool is shutting down (interrupted)
                    engine.batch_slots.release()
                    with self.lock:
                        self.submitted -= 1
                    return
            self.read_complete = True
        finally:
            engine.progress.add(nbytes=max((self.obj.size or 0) - seen, 0))
            opened.close()

    # -- answers (model threads) -------------------------------------------------------------

    def _call(self, seq: int, caller: BatchCaller, batch: RecordBatch | ColumnBatch) -> None:
        try:
            with tracing.activate(tracing.context_of(self.span)):
                result = caller.run(batch)
        except Exception as exc:  # a bug of ours: fail the object, keep the run going
            log.exception("transforming %s failed", self.obj.url)
            result = BatchResult(failure=RecordFailure(
                where(batch.record(0), self.engine.job.split_type), f"internal error: {type(exc).__name__}: {exc}"
            ))
        finally:
            self.engine.batch_slots.release()
        with self.lock:
            self.pending[seq] = result
            while self.next in self.pending:
                done = self.pending.pop(self.next)
                self.next += 1
                if self.failure is not None:
                    continue
                if done.failure is not None:
                    self.failure = done.failure
                    continue
                assert self.writer is not None
                try:
                    for piece in done.pieces:
                        self.writer.write(piece)
                    if self.capture is not None:
                        for line in done.capture:
                            self.capture.write(line)
                except OSError as exc:  # a full disk, say: the object fails, the run goes on
                    self.failure = RecordFailure("the object", f"cannot write {self.engine.store.display(self.obj.out_name)}"
                                                 f" or its capture: {type(exc).__name__}: {exc}")
                    continue
                self.dead.extend(done.dead)
                self.records += done.records
                self.engine.progress.add(records=done.records)
            self._maybe_finish()

    def _fail(self, failure: RecordFailure) -> None:
        with self.lock:
            self.read_failure = failure

    def _maybe_finish(self) -> None:
        """Called with the lock held: hand the object to a writer once every answer is in."""
        if self.read_done and self.next == self.submitted and not self.finishing:
            self.finishing = True
            try:
                self.engine.write_pool.submit(self._finish)
            except RuntimeError:
                self._finish()

    # -- publishing (a writer thread) --------------------------------------------------------

    def _finish(self) -> None:
        engine, obj = self.engine, self.obj
        store = engine.store
        try:
            # a record that failed before the reader stopped is the first reason, else the reader's
            self.failure = self.failure or self.read_failure
            if self.failure is None and not self.read_complete:
                self.failure = RecordFailure("the object", "interrupted before it was read to the end")
            self.outcome = publish(
                store, engine.state, obj, self.writer, self.records, self.dead, engine.stale_dead_letters,
                failure=self.failure, capture=self.capture,
            )
        except Exception as exc:  # a bug of ours: the object fails, its partial output goes
            self.outcome = publish(store, engine.state, obj, self.writer, self.records, [], set(), error=exc,
                                   capture=self.capture)
        finally:
            failure = self.outcome.failure
            tracing.end(self.span, None if self.outcome.status != "failed" else
                        f"{failure.where}: {failure.error}" if failure is not None else "failed")
            if self.holds_slot:
                engine.object_slots.release()
            engine.progress.add(objects=1, failed=int(self.outcome.status == "failed"))
            self.finished.set()


def object_format(job: TransformJob, obj: InputObject) -> tuple[str, str | None]:
    """(content type, record format) of one object; JobError/RecordError when the job cannot
    transform it (filters on a non-CSV/JSON object, a whole object over --max-payload)."""
    content_type = job.content_type or JSON  # SageMaker sends this when the job names no ContentType
    fmt = record_format(content_type)
    if job.reads_records and fmt is None:
        raise JobError(
            f"--input-filter and --join-source need CSV or JSON records, "
            f"but {obj.url} is sent as {content_type}; "
            "set --content-type text/csv or application/jsonlines"
        )
    size = obj.size or 0
    if job.split_type == "None" and job.compression_type == "None" and size > job.max_payload_bytes:
        raise RecordError(
            f"{obj.url} is {size / 2**20:.3g} MB, over --max-payload {job.max_payload_mb:g} MB, and "
            "--split-type None sends each object whole; use --split-type Line/RecordIO/TFRecord "
            "or raise --max-payload"
        )
    return content_type, fmt


def request_batches(opened: OpenedInput, job: TransformJob, processing: DataProcessing) -> Iterator[RecordBatch]:
    """One object's requests in order: its records, filtered and packed up to --max-payload.
    Every engine sends exactly these."""
    blank = blank_test(job.split_type)

    def prepared() -> Iterator[tuple[RecordChunk, list[bytes | None], dict[int, str]]]:
        for chunk in iter_record_chunks(opened.stream, job.split_type, opened.obj.url):
            payloads, errors = processing.prepare_many(chunk.framed or chunk.data, blank)  # framing kept
            yield chunk, payloads, errors

    return _pack(job, opened.obj.url, prepared())


def object_requests(
    opened: OpenedInput, job: TransformJob, processing: DataProcessing, columns: bool
) -> Iterator[RecordBatch | ColumnBatch]:
    """`request_batches`, with `columns` plain CSV records travelling as Arrow columns
    (batch.columnar) where the job allows it, in the same requests."""
    if not (columns and columns_apply(processing, job.split_type, job.batch_strategy, job.per_record)):
        return request_batches(opened, job, processing)

    def pack_rows(chunks: Iterable[tuple[RecordChunk, list[bytes | None], dict[int, str]]]) -> Iterator[RecordBatch]:
        return _pack(job, opened.obj.url, chunks)

    return column_batches(iter_text_blocks(opened.stream), processing, max_bytes=job.max_payload_bytes, pack_rows=pack_rows)


def _pack(
    job: TransformJob, name: str, chunks: Iterable[tuple[RecordChunk, list[bytes | None], dict[int, str]]]
) -> Iterator[RecordBatch]:
    return pack_batches(
        chunks,
        split_type=job.split_type,
        batch_strategy=job.batch_strategy,
        max_bytes=job.max_payload_bytes,
        name=name,
        limit_mb=job.max_payload_mb,
    )


class _WriteError(Exception):
    pass


def failure_from(exc: BaseException, obj: InputObject) -> RecordFailure:
    """Why `obj` could not be read, split or written, from the exception that stopped it: the
    record and message for the failure report (an unexpected one is logged with its traceback)."""
    if isinstance(exc, _WriteError):
        return RecordFailure("the object", str(exc))
    if isinstance(exc, RecordError):
        return RecordFailure(exc.where, exc.message)
    if isinstance(exc, ServingError):
        return RecordFailure("the object", exc.message)
    if gzip_error(exc):
        return RecordFailure(
            "the object", f"{obj.url} is not valid gzip ({exc}); drop --compression-type Gzip or fix the file"
        )
    if isinstance(exc, OSError):
        return RecordFailure("the object", f"cannot read {obj.url}: {type(exc).__name__}: {exc}")
    log.error("reading %s failed", obj.url, exc_info=exc)
    return RecordFailure("the object", f"internal error reading {obj.url}: {type(exc).__name__}: {exc}")


def content_type_hint(job: TransformJob, objects: list[InputObject]) -> str | None:
    """Without --content-type every object is sent as application/json, as SageMaker does for a
    job without a ContentType; when objects look like images, say once which type image
    handlers expect (they check for application/x-image and would refuse every object)."""
    if job.content_type is not None:
        return None
    images = [o for o in objects if guess_content_type(o.rel, job.compression_type).startswith("image/")]
    if not images:
        return None
    return (
        f"{len(images)} of {len(objects)} input objects are images (e.g. {images[0].rel}); without "
        f"--content-type they are sent as {JSON}, as SageMaker sends objects of a job that names no "
        f"ContentType. SageMaker image handlers expect --content-type {X_IMAGE}"
    )


def list_job_inputs(job: TransformJob) -> list[InputObject]:
    """The job's input objects, after checking that OUTPUT is a folder outside INPUT."""
    out_fs, out_root = url_to_fs(job.output)
    if is_local(out_fs) and os.path.exists(out_root) and not os.path.isdir(out_root):
        raise JobError(f"OUTPUT {job.output} is a file; give a folder (it is made if missing)")
    check_output_outside_input(job)
    try:
        objects = list_inputs(job)
    except OSError as exc:
        raise JobError(f"cannot list INPUT {job.input}: {type(exc).__name__}: {exc}") from None
    hint = content_type_hint(job, objects)
    if hint:
        log.warning(hint)
    return objects


def check_output_outside_input(job: TransformJob) -> None:
    """OUTPUT inside INPUT would make a rerun take outputs for inputs."""
    if job.data_type != "S3Prefix":
        return
    in_fs, in_root = url_to_fs(job.input)
    out_fs, out_root = url_to_fs(job.output)
    if type(in_fs) is not type(out_fs):
        return
    if is_local(in_fs):
        in_root, out_root = os.path.realpath(in_root), os.path.realpath(out_root)
    in_root, out_root = in_root.rstrip("/"), out_root.rstrip("/")
    inside = out_root == in_root or out_root.startswith(in_root + "/")
    if not inside and out_root.startswith(in_root):
        inside = not in_fs.isdir(in_root)  # an S3 key prefix takes every name starting with it
    if inside:
        raise JobError(
            f"OUTPUT {job.output} is inside INPUT {job.input}; outputs would be read as inputs "
            "on the next run. Write the outputs somewhere else"
        )
