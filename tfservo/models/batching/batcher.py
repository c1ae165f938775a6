"""Server-side dynamic batching: concurrent requests merged into one model call (TF Serving style).

Scheduling follows TF Serving's BasicBatchScheduler: tasks with the same signature, output keys
and input keys/dtypes/non-batch shapes share a queue of batches; a batch closes when full or
`batch_timeout_micros` after its first task arrived; `num_batch_threads` threads (shared by
every batcher of one `BatchScheduler`) run closed batches, oldest first; a queue holding
`max_enqueued_batches` batches refuses new calls at once with ResourceExhausted.

The adaptive mode (tfservo's default) is eager when idle and batched under load: a batch whose
first call finds none of its batcher's batches queued or running is ready at once (a lone
request runs without waiting); a batch started while others are queued or running waits to
fill, up to the timeout, as TF Serving's does. Calls submitted from an event loop
(`LoopBatches`) to a quick model — its batches run within `core.call_costs.LOOP_SECONDS` — are
batched on that loop instead: what arrives in one turn of the loop runs as one batch in the
loop's thread, with no hand-off to a batch thread and back (for such a model the hand-offs
cost about what batching saves); and a call its door knows to be the only request it holds
(`run_lone`: nothing can join its batch) runs at once and returns its outputs, without waiting
for the loop's turn to gather or calling back. It never changes an answer: a call that fills a
batch by itself runs alone, a model whose outputs are not batch-major is run one call at a time
from its first such batch on, and a merged batch that fails is rerun call by call so that each
caller gets its own result.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tfservo.core import deadlines, tracing
from tfservo.core.batch_split import Failed, is_transient, isolate
from tfservo.core.batching_options import BatchingOptions
from tfservo.core.call_costs import CallCosts
from tfservo.core.errors import InvalidArgument, ResourceExhausted, Unavailable
from tfservo.models.signatures import Runner

if TYPE_CHECKING:
    from tfservo.models.servables import ServableVersion

__all__ = [
    "Batcher",
    "BatchHook",
    "BatchingRunnerFactory",
    "BatchScheduler",
    "Callback",
    "LoopBatches",
    "make_runner_factory",
    "ModelBatchHook",
    "QueueHook",
]

log = logging.getLogger("tfservo.models.batching")

# (rows, padded rows, seconds run, seconds its first row queued) of each batch one Batcher ran.
BatchHook = Callable[[int, int, float, float], None]
# The same with the model's name first: a runner factory's hook, shared by every model's batchers.
ModelBatchHook = Callable[[str, int, int, float, float], None]
# (change) of the rows waiting in one Batcher's queue: +rows as a call joins, -rows as its batch starts.
QueueHook = Callable[[int], None]
# Called once, on a batch thread, with a submitted call's outputs or its error.
Callback = Callable[[dict[str, np.ndarray] | None, BaseException | None], None]


class _Task:
    """One caller's rows (a chunk of them when the call was split), and where its result goes."""

    __slots__ = ("inputs", "size", "finished", "waiter", "outputs", "error", "callback", "deadline", "trace", "queued_ns")
    # A task with a callback was submitted from a caller with no "model" span of its own open
    # (the event loop's queued predicts): its batch spans get one around them. Only a task
    # without one has a caller blocked on it, so only that task gets an Event to wake it.

    def __init__(self, inputs: dict[str, np.ndarray], size: int, callback: Callback | None = None) -> None:
        self.inputs = inputs
        self.size = size
        self.trace = tracing.parent()  # the caller's trace (None when tracing is off)
        self.queued_ns = tracing.now_ns() if self.trace is not None else 0
        self.deadline = deadlines.current()  # past it the caller has given up: the rows are dropped
        self.finished = False
        self.waiter = threading.Event() if callback is None else None
        self.outputs: dict[str, np.ndarray] | None = None
        self.error: BaseException | None = None
        self.callback = callback

    def wait(self) -> bool:
        """Block a caller until its rows are done or its deadline passes (False then)."""
        assert self.waiter is not None, "only a task without a callback is waited for"
        return self.waiter.wait(deadlines.remaining(self.deadline))

    def finish(self, outputs: dict[str, np.ndarray] | None, error: BaseException | None) -> None:
        if not self.finished:
            self.outputs, self.error = outputs, error
            self.finished = True
            if self.waiter is not None:
                self.waiter.set()
            if self.callback is not None:
                try:
                    self.callback(outputs, _clone(error) if error is not None else None)
                except Exception:
                    log.exception("result callback failed")


class _Queue:
    """Batches of one batcher that can be merged: same signature, outputs and input layout."""

    __slots__ = ("key", "owner", "signature", "output_keys", "batches")

    def __init__(
        self, key: tuple[object, ...], owner: Batcher, signature: str, output_keys: tuple[str, ...] | None
    ) -> None:
        self.key = key
        self.owner = owner
        self.signature = signature
        self.output_keys = output_keys
        self.batches: deque[_Batch] = deque()


class _Batch:
    __slots__ = ("queue", "tasks", "size", "created", "closed", "at_once")

    def __init__(self, queue: _Queue, at_once: bool = False) -> None:
        self.queue = queue
        self.tasks: list[_Task] = []
        self.size = 0
        self.created = time.monotonic()
        self.closed = False
        self.at_once = at_once  # ready now, though it may still grow until a thread takes it


class LoopBatches:
    """Calls of quick models gathered on one event loop and run there: what its requests submit
    within one turn of the loop runs as one batch per kind of call (at most max_batch_size rows
    each), once those requests' steps have run (`call_soon`: the loop's next turn)."""

    def __init__(self, call_soon: Callable[[Callable[[], None]], object]) -> None:
        self._call_soon = call_soon
        self._pending: dict[tuple[object, ...], list[_Batch]] = {}

    def _add(self, owner: Batcher, key: tuple[object, ...], signature: str, outs: tuple[str, ...] | None,
             task: _Task) -> None:
        pending = self._pending
        if not pending:
            self._call_soon(self._run)
        batches = pending.get(key)
        if batches is None:
            batches = pending[key] = [_Batch(_Queue(key, owner, signature, outs), at_once=True)]
        last = batches[-1]
        if last.size + task.size > owner._max:
            last = _Batch(last.queue, at_once=True)
            batches.append(last)
        last.tasks.append(task)
        last.size += task.size

    def gathering(self, key: tuple[object, ...]) -> bool:
        """Whether calls of this kind wait for the loop's turn now (a lone call joins them)."""
        return key in self._pending

    def after_turn(self, fn: Callable[[], None]) -> None:
        """`fn()` on the loop's next turn (after what this turn answers is written)."""
        self._call_soon(fn)

    def _run(self) -> None:
        pending, self._pending = self._pending, {}
        for batches in pending.values():
            for batch in batches:
                batch.queue.owner._run_here(batch)


class BatchScheduler:
    """The batch threads and queues shared by batchers (TF Serving's SharedBatchScheduler)."""

    def __init__(self, num_batch_threads: int, name: str = "tfservo-batch") -> None:
        if num_batch_threads < 1:
            raise ValueError(f"num_batch_threads={num_batch_threads} must be at least 1")
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # a batch may have become ready
        self._space = threading.Condition(self._lock)  # a queue may have room again
        self._queues: dict[tuple[object, ...], _Queue] = {}
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
            for i in range(num_batch_threads)
        ]
        for t in self._threads:
            t.start()

    def close(self, timeout: float = 5.0) -> None:
        """Fail every queued call with Unavailable and stop the threads after their running batches."""
        with self._lock:
            self._stopped = True
            queues, self._queues = list(self._queues.values()), {}
            self._work.notify_all()
            self._space.notify_all()
        for q in queues:
            q.owner._queued(-sum(b.size for b in q.batches))
            q.owner._fail([t for b in q.batches for t in b.tasks])
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._lock:
                while True:
                    if self._stopped:
                        return
                    batch, wait = self._take_ready(time.monotonic())
                    if batch is not None:
                        break
                    self._work.wait(wait)
                if self._queues:  # more may be ready; let another idle thread look
                    self._work.notify()
                self._space.notify_all()
            owner = batch.queue.owner
            try:
                owner._process(batch)
            finally:
                with self._lock:
                    owner._busy -= 1

    def _take_ready(self, now: float) -> tuple[_Batch | None, float | None]:
        """Pop the oldest ready head batch; else None and how long until one times out."""
        best: tuple[tuple[object, ...], _Queue] | None = None
        wait: float | None = None
        for key, q in self._queues.items():
            head = q.batches[0]
            due = head.created + q.owner._timeout
            if head.closed or head.at_once or q.owner._eager or due <= now:
                if best is None or head.created < best[1].batches[0].created:
                    best = (key, q)
            elif wait is None or due - now < wait:
                wait = due - now
        if best is None:
            return None, wait
        key, q = best
        batch = q.batches.popleft()
        batch.closed = True
        if not q.batches:
            del self._queues[key]
        q.owner._queued(-batch.size)
        return batch, None


class Batcher:
    """A Runner that merges concurrent calls into batched calls of the wrapped Runner.

    Each caller blocks until its own rows come back (every output sliced along axis 0). Calls
    larger than `max_batch_size` are split into chunks and reassembled in order; the first chunk
    is admitted or refused at once, later chunks wait for room in the queue. Scalar inputs and
    empty batches bypass batching. A model error fails every caller in that batch.

    `eager=True` closes a batch as soon as a batch thread is free instead of waiting
    `batch_timeout_micros`: a lone request runs immediately, and batches still form under load
    (requests pile up while every thread is busy). The trade-off: at light or moderate load
    batches are smaller, so there are more model calls per request and (with
    `allowed_batch_sizes`) more padding, and batch sizes depend on `num_batch_threads`; the
    timeout instead trades a fixed latency for fuller batches.

    `adaptive=True` (see the module's docstring): eager when none of this batcher's batches is
    queued or running, the timeout otherwise.
    """

    def __init__(
        self,
        runner: Runner,
        options: BatchingOptions,
        *,
        name: str = "model",
        on_batch: BatchHook | None = None,
        on_queue: QueueHook | None = None,
        scheduler: BatchScheduler | None = None,
        span_attributes: Callable[[str], dict[str, Any]] | None = None,
    ) -> None:
        self._runner = runner
        self._options = options
        self._name = name
        self._on_batch = on_batch
        self._on_queue = on_queue
        # A signature's "model" span attributes (ServableVersion.span_attributes)
        self._span_attributes = span_attributes or (lambda signature: {"tfservo.model.signature": signature})
        self._max = options.max_batch_size
        self._timeout = options.batch_timeout_seconds
        self._eager = options.eager
        self._adaptive = options.adaptive
        self._busy = 0  # batches of this batcher queued or running (under the scheduler's lock)
        # Queue keys whose outputs proved not batch-major (adaptive mode runs those calls alone).
        self._solo: set[tuple[object, ...]] = set()
        # How long each queue key's batches take to run (whether its calls may batch on a loop).
        self._costs = CallCosts()
        self._owns_scheduler = scheduler is None
        self._scheduler = scheduler or BatchScheduler(
            options.num_batch_threads, name=f"tfservo-batch-{name}".replace(" ", "-")
        )
        self._closed = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def options(self) -> BatchingOptions:
        return self._options

    def __call__(
        self,
        signature_name: str,
        inputs: dict[str, np.ndarray],
        output_keys: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run `inputs` as part of a batch and return this call's rows of every output."""
        arrays, size = self._batch_rows(signature_name, inputs)
        if not size:
            return self._runner(signature_name, arrays, output_keys)
        outs = tuple(output_keys) if output_keys is not None else None
        key = self._queue_key(signature_name, outs, arrays)
        if self._alone(key, size):
            return self._runner(signature_name, arrays, output_keys)
        if self._adaptive:  # a blocking caller (a thread of its own) runs an idle batcher's call itself
            outputs = self._run_now(key, signature_name, arrays, outs)
            if outputs is not None:
                return outputs
        if size <= self._max:
            tasks = [_Task(arrays, size)]
        else:
            tasks = [
                _Task({k: a[i : i + self._max] for k, a in arrays.items()}, min(self._max, size - i))
                for i in range(0, size, self._max)
            ]
        for i, task in enumerate(tasks):
            # Only the first chunk may be refused; an admitted call waits for room for the rest.
            # If a later chunk fails (unloading), chunks already queued run and are dropped.
            self._enqueue(key, signature_name, outs, task, block=i > 0)
        results = []
        for task in tasks:
            if not task.wait():
                task.finish(None, self._late(signature_name))  # its batch will skip it
            if task.error is not None:
                raise _clone(task.error)
            results.append(task.outputs)
        if len(results) == 1:
            return results[0]  # type: ignore[return-value]
        first = results[0]
        assert first is not None
        return {k: np.concatenate([r[k] for r in results], axis=0) for k in first}  # type: ignore[index]

    run = __call__

    def submit(
        self,
        signature_name: str,
        inputs: dict[str, np.ndarray],
        output_keys: Sequence[str] | None,
        callback: Callback,
        *,
        here: LoopBatches | None = None,
    ) -> bool:
        """Queue `inputs` without waiting; `callback` gets this call's rows from a batch thread.

        For callers that must not block (the event loop). False, with nothing queued, when the
        call needs the blocking path (more rows than max_batch_size, no batch dimension): use
        `run` then. A full queue raises ResourceExhausted here, as `run` does. `here`: the
        caller's event loop; in adaptive mode, when this kind of call's batches are quick,
        the call is batched on that loop and `callback` runs there.
        """
        kind = self._kind(signature_name, inputs, output_keys)
        if kind is None:
            return False
        arrays, size, outs, key = kind
        if here is not None and self._adaptive and self._costs.quick(key):
            if self._closed:
                raise Unavailable(f"model {self._name} is unloading; retry the request")
            here._add(self, key, signature_name, outs, _Task(arrays, size, callback))
            return True
        self._enqueue(key, signature_name, outs, _Task(arrays, size, callback), block=False)
        return True

    def run_lone(
        self, signature_name: str, inputs: dict[str, np.ndarray], output_keys: Sequence[str] | None,
        here: LoopBatches,
    ) -> dict[str, np.ndarray] | None:
        """This call's outputs, run at once in the caller's thread (on `here`'s loop) when its
        caller knows that no other call can join its batch now (its door holds no other
        request), this adaptive batcher is idle, its kind of call quick and none of that kind
        gathering on the loop; None, with nothing run, otherwise: `submit` it then. A model
        error raises here."""
        kind = self._kind(signature_name, inputs, output_keys) if self._adaptive else None
        if kind is None:
            return None
        arrays, _, outs, key = kind
        if not self._costs.quick(key) or here.gathering(key):
            return None
        if self._closed:
            raise Unavailable(f"model {self._name} is unloading; retry the request")
        started_ns = tracing.now_ns()
        # Its metrics wait for the loop's next turn: after the answer is written.
        outputs = self._run_now(key, signature_name, arrays, outs, later=here.after_turn)
        if outputs is not None:
            within = tracing.parent()
            if within is not None:
                self._model_span(within, signature_name, started_ns, tracing.now_ns())
        return outputs

    def _kind(
        self, signature_name: str, inputs: dict[str, np.ndarray], output_keys: Sequence[str] | None,
    ) -> tuple[dict[str, np.ndarray], int, tuple[str, ...] | None, tuple[object, ...]] | None:
        """(arrays, rows, output keys, queue key) of a call that may join a batch; None for one
        that needs the blocking path (no rows, more than a batch holds) or runs alone (`_alone`)."""
        arrays, size = self._batch_rows(signature_name, inputs)
        if not size or size > self._max:
            return None
        outs = tuple(output_keys) if output_keys is not None else None
        key = self._queue_key(signature_name, outs, arrays)
        if self._alone(key, size):
            return None
        return arrays, size, outs, key

    def _run_now(
        self, key: tuple[object, ...], signature: str, arrays: dict[str, np.ndarray], outs: tuple[str, ...] | None,
        *, later: Callable[[Callable[[], None]], None] | None = None,
    ) -> dict[str, np.ndarray] | None:
        """Run one call in the caller's thread if no batch of this batcher is queued or running
        (calls arriving meanwhile wait to merge, as behind any running batch); None if not idle.
        Its batch metrics are reported at once, or handed to `later`."""
        sched = self._scheduler
        with sched._lock:
            if self._busy or self._closed or sched._stopped:
                return None
            self._busy += 1
        size = next(iter(arrays.values())).shape[0]
        try:
            t0 = time.perf_counter()
            outputs = self._runner(signature, arrays, list(outs) if outs is not None else None)
            seconds = time.perf_counter() - t0
        finally:
            with sched._lock:
                self._busy -= 1
        self._costs.note(key, seconds)
        if later is None:
            self._report(size, size, seconds, 0.0)
        else:
            later(functools.partial(self._report, size, size, seconds, 0.0))
        return {k: np.asarray(v) for k, v in outputs.items()}

    def _run_here(self, batch: _Batch) -> None:
        """Run a batch gathered on an event loop in the loop's thread (LoopBatches)."""
        sched = self._scheduler
        with sched._lock:
            refused = self._closed or sched._stopped
            if not refused:
                self._busy += 1
        if refused:
            self._fail(batch.tasks)
            return
        try:
            self._process(batch)
        finally:
            with sched._lock:
                self._busy -= 1

    def _report(self, size: int, padded: int, seconds: float, queued: float) -> None:
        """The batch hook (the metrics), which must never fail a call."""
        if self._on_batch is not None:
            try:
                self._on_batch(size, padded, seconds, queued)
            except Exception:
                log.exception("batch hook failed for model %s", self._name)

    def _queued(self, change: int) -> None:
        """The queue hook (the metrics' queue depth), under the scheduler's lock; never fails a call."""
        if self._on_queue is not None and change:
            try:
                self._on_queue(change)
            except Exception:
                log.exception("queue hook failed for model %s", self._name)

    def _alone(self, key: tuple[object, ...], size: int) -> bool:
        """Adaptive mode runs a call outside any batch when it fills one by itself, or when its
        kind of call proved not batchable."""
        return self._adaptive and (size >= self._max or key in self._solo)

    def _batch_rows(self, signature_name: str, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        """The inputs as arrays and their common batch size (0: scalars or no rows, not batched)."""
        if len(inputs) == 1:  # the usual case, in fewer steps
            ((name, value),) = inputs.items()
            array = np.asarray(value)
            return {name: array}, (array.shape[0] if array.ndim else 0)
        arrays = {k: np.asarray(v) for k, v in inputs.items()}
        if not arrays or any(a.ndim == 0 for a in arrays.values()):
            return arrays, 0
        sizes = {k: a.shape[0] for k, a in arrays.items()}
        size = next(iter(sizes.values()))
        if any(n != size for n in sizes.values()):
            listed = ", ".join(f"{k}: {n}" for k, n in sizes.items())
            raise InvalidArgument(
                f"inputs of signature '{signature_name}' of model {self._name} have different "
                f"batch sizes (dimension 0: {listed}); send the same number of rows for every input"
            )
        return arrays, size

    def _queue_key(
        self, signature_name: str, outs: tuple[str, ...] | None, arrays: dict[str, np.ndarray]
    ) -> tuple[object, ...]:
        """Calls with equal keys may share a batch: same signature, outputs and input layout."""
        if len(arrays) == 1:  # the usual case, in fewer steps
            ((name, array),) = arrays.items()
            return (self, signature_name, outs, (name, _dtype_key(array.dtype), array.shape[1:]))
        return (self, signature_name, outs) + tuple(
            (k, _dtype_key(a.dtype), a.shape[1:]) for k, a in sorted(arrays.items())
        )

    def close(self) -> None:
        """Fail this batcher's queued calls with Unavailable and stop taking new ones."""
        sched = self._scheduler
        dropped: list[_Task] = []
        with sched._lock:
            self._closed = True
            for key in [k for k, q in sched._queues.items() if q.owner is self]:
                for batch in sched._queues.pop(key).batches:
                    batch.closed = True
                    self._busy -= 1
                    dropped.extend(batch.tasks)
                    self._queued(-batch.size)
            sched._space.notify_all()
        self._fail(dropped)
        if self._owns_scheduler:
            sched.close()

    def _fail(self, tasks: list[_Task]) -> None:
        error = Unavailable(f"model {self._name} was unloaded before its batch ran; retry the request")
        for task in tasks:
            task.finish(None, error)

    # -- internals -------------------------------------------------------------------------

    def _enqueue(
        self, key: tuple[object, ...], signature: str, outs: tuple[str, ...] | None, task: _Task, block: bool
    ) -> None:
        """Add a task to its queue's open batch or a new one; refuse (or wait) when full."""
        sched = self._scheduler
        with sched._lock:
            while True:
                if self._closed or sched._stopped:
                    raise Unavailable(f"model {self._name} is unloading; retry the request")
                q = sched._queues.get(key)
                open_batch = q.batches[-1] if q is not None and not q.batches[-1].closed else None
                if open_batch is not None:
                    if open_batch.size + task.size <= self._max:
                        self._add(open_batch, task)
                        return
                    open_batch.closed = True  # cannot take this task, so it is done growing
                    sched._work.notify()
                waiting = len(q.batches) if q is not None else 0
                if waiting < self._options.max_enqueued_batches:
                    if q is None:
                        q = sched._queues[key] = _Queue(key, self, signature, outs)
                    batch = _Batch(q, at_once=self._adaptive and self._busy == 0)
                    self._busy += 1
                    q.batches.append(batch)
                    self._add(batch, task)
                    sched._work.notify()
                    return
                if not block:
                    raise ResourceExhausted(
                        f"batch queue full for model {self._name} (signature '{signature}': "
                        f"{waiting} batches waiting, max_enqueued_batches {self._options.max_enqueued_batches}); "
                        "retry later, or raise SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES (max_enqueued_batches in "
                        "--batching-parameters-file), or serve with more --workers"
                    )
                sched._space.wait()

    def _add(self, batch: _Batch, task: _Task) -> None:
        batch.tasks.append(task)
        batch.size += task.size
        self._queued(task.size)
        if batch.size >= self._max:
            batch.closed = True
            self._scheduler._work.notify()

    def _late(self, signature: str) -> deadlines.DeadlineExceeded:
        return deadlines.DeadlineExceeded(
            f"model {self._name} (signature '{signature}'): the request's deadline passed while it waited "
            "for its batch; allow more time, or send less load"
        )

    def _trace(self, tasks: list[_Task], signature: str, size: int, padded: int, started_ns: int) -> None:
        """Each traced caller's wait in the queue and the batched run it shared, as its spans."""
        ended_ns = tracing.now_ns()
        for t in tasks:
            if t.trace is not None:
                within: tracing.Parent = t.trace
                if t.callback is not None:
                    within = self._model_span(t.trace, signature, t.queued_ns, ended_ns)
                if not tracing.phases():
                    continue
                attributes: dict[str, str | int] = {"tfservo.batcher": self._name, "tfservo.model.signature": signature,
                              "tfservo.batch.size": size, "tfservo.batch.padded_size": padded,
                              "tfservo.batch.callers": len(tasks), "tfservo.batch.rows": t.size}
                tracing.record("batch.queue", within, t.queued_ns, started_ns, attributes, phase=True)
                tracing.record("batch.run", within, started_ns, ended_ns, attributes, phase=True)

    def _model_span(self, within: tracing.Parent, signature: str, start_ns: int, end_ns: int) -> tracing.Parent:
        """The "model" span a submitted call gets (a blocking caller's ServableVersion.run opens its own)."""
        return tracing.record("model", within, start_ns, end_ns, self._span_attributes(signature))

    def _process(self, batch: _Batch) -> None:
        """Run one closed batch and hand every task its rows (or the batch's error); rows of
        callers who gave up (done, or past their deadline) are left out."""
        for t in batch.tasks:
            if not t.finished and deadlines.expired(t.deadline):
                t.finish(None, self._late(batch.queue.signature))
        tasks = [t for t in batch.tasks if not t.finished]
        size = sum(t.size for t in tasks)
        if not tasks:
            return
        queued = time.monotonic() - batch.created
        padded = _padded_size(size, self._options.allowed_batch_sizes)
        try:
            if len(tasks) == 1:
                inputs = tasks[0].inputs
            else:
                keys = tasks[0].inputs.keys()
                inputs = {k: np.concatenate([t.inputs[k] for t in tasks], axis=0) for k in keys}
            if padded > size:
                inputs = {
                    k: np.concatenate([a, np.repeat(a[:1], padded - size, axis=0)], axis=0)
                    for k, a in inputs.items()
                }
            q = batch.queue
            keys_arg = list(q.output_keys) if q.output_keys is not None else None
            t0, started_ns = time.perf_counter(), tracing.now_ns()
            outputs = self._runner(q.signature, inputs, keys_arg)
            seconds = time.perf_counter() - t0
            self._costs.note(q.key, seconds)
            self._trace(tasks, q.signature, size, padded, started_ns)
            outputs = {k: np.asarray(v) for k, v in outputs.items()}
            misfit = next((k for k, v in outputs.items() if v.ndim == 0 or v.shape[0] != padded), None)
            if misfit is not None and self._adaptive:
                if len(tasks) > 1 or padded != size:
                    with self._scheduler._lock:
                        self._solo.add(q.key)
                    log.info("model %s (signature '%s'): output '%s' is not batch-major; its calls now "
                             "run one at a time", self._name, q.signature, misfit)
                    self._run_each(tasks, q)
                    return
                tasks[0].finish(outputs, None)  # a lone call gets the model's answer as it is
            elif misfit is not None:
                raise InvalidArgument(
                    f"output '{misfit}' of signature '{q.signature}' of model {self._name} has shape "
                    f"{list(outputs[misfit].shape)}, but batching needs every output's first dimension "
                    f"to be the batch size ({padded}); request only batch-major outputs or disable "
                    "batching (SAGEMAKER_TFS_ENABLE_BATCHING=false)"
                )
            elif len(tasks) == 1 and padded == size:
                tasks[0].finish(outputs, None)  # all the batch's rows are its one caller's
            else:
                offset = 0
                for t in tasks:
                    t.finish({k: v[offset : offset + t.size] for k, v in outputs.items()}, None)
                    offset += t.size
        except BaseException as exc:
            if self._adaptive and len(tasks) > 1 and isinstance(exc, Exception) and not is_transient(exc):
                self._split(tasks, batch.queue, exc)  # one caller's bad rows fail only that caller
                return
            for t in tasks:
                t.finish(None, exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            for t in tasks:  # never leave a caller waiting, whatever happened
                if not t.finished:
                    t.finish(None, Unavailable(f"model {self._name}: batch was abandoned; retry"))
        self._report(size, padded, seconds, queued)

    def _split(self, tasks: list[_Task], q: _Queue, error: Exception) -> None:
        """A failed batch's callers, split by core.batch_split's rule (its queue holds one
        structure of inputs, so each caller runs alone)."""
        keys_arg = list(q.output_keys) if q.output_keys is not None else None
        outcomes = isolate(tasks, error, lambda group: [self._runner(q.signature, group[0].inputs, keys_arg)])
        for t, outcome in zip(tasks, outcomes):
            if isinstance(outcome, Failed):
                t.finish(None, outcome.error)
            elif isinstance(outcome, dict):
                t.finish(outcome, None)

    def _run_each(self, tasks: list[_Task], q: _Queue) -> None:
        """Run each task as a call of its own (adaptive mode's answer to a batch that failed or
        whose outputs cannot be split)."""
        keys_arg = list(q.output_keys) if q.output_keys is not None else None
        for t in tasks:
            try:
                t.finish(self._runner(q.signature, t.inputs, keys_arg), None)
            except Exception as exc:
                t.finish(None, exc)


def _padded_size(size: int, allowed: Sequence[int]) -> int:
    for s in allowed:
        if s >= size:
            return s
    return size


def _dtype_key(dtype: np.dtype) -> str:
    # Fixed-width strings of different widths concatenate fine, so they share a queue.
    return dtype.kind if dtype.kind in "SU" else dtype.str


def _clone(exc: BaseException) -> BaseException:
    """A copy of a batch's error for one caller, so callers' tracebacks don't pile onto one object."""
    try:
        clone = copy.copy(exc)
    except Exception:
        return exc
    if type(clone) is not type(exc) or str(clone) != str(exc):
        return exc
    clone.__cause__, clone.__context__ = exc.__cause__, exc.__context__
    return clone.with_traceback(exc.__traceback__)


class BatchingRunnerFactory:
    """A RunnerFactory giving each loaded version a Batcher; all share one set of batch threads."""

    def __init__(
        self, options: BatchingOptions, on_batch: ModelBatchHook | None = None,
        on_queue: Callable[[str, int], None] | None = None,
    ) -> None:
        self.options = options
        self.on_batch = on_batch
        self.on_queue = on_queue  # (model, change of its queued rows)
        self._scheduler: BatchScheduler | None = None
        self._per_model: dict[str, BatchingOptions] = {}  # a model's own (a V2 repository load's config)
        self._lock = threading.Lock()

    def options_for(self, name: str | None) -> BatchingOptions:
        """The options the versions of model `name` are batched with (None: the server's)."""
        with self._lock:
            return self._per_model.get(name, self.options) if name is not None else self.options

    def set_model_options(self, name: str, options: BatchingOptions | None) -> None:
        """Batch the versions of `name` loaded from now on with `options` (None: the server's);
        the batch threads stay the server's."""
        with self._lock:
            if options is None:
                self._per_model.pop(name, None)
            else:
                self._per_model[name] = options

    def __call__(self, sv: ServableVersion) -> Batcher:
        with self._lock:
            if self._scheduler is None:
                self._scheduler = BatchScheduler(self.options.num_batch_threads)
            scheduler = self._scheduler
        model = sv.model
        assert model is not None, "a runner is made right after the version loaded"
        return Batcher(
            model.run,
            self.options_for(sv.model_name),
            name=f"{sv.model_name} version {sv.version}",
            on_batch=functools.partial(self.on_batch, sv.model_name) if self.on_batch else None,
            on_queue=functools.partial(self.on_queue, sv.model_name) if self.on_queue else None,
            scheduler=scheduler,
            span_attributes=sv.span_attributes,
        )

    def close(self) -> None:
        """Stop the shared batch threads (queued calls of every batcher fail with Unavailable)."""
        with self._lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.close()


def make_runner_factory(
    options: BatchingOptions, on_batch: ModelBatchHook | None = None,
    on_queue: Callable[[str, int], None] | None = None,
) -> BatchingRunnerFactory:
    """The RunnerFactory to hand ModelManager when batching is on; on_batch(model, rows, padded,
    seconds, queued) after each batch, on_queue(model, change) as rows join or leave a queue."""
    return BatchingRunnerFactory(options, on_batch, on_queue)
