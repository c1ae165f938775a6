"""The transform job on a Ray cluster (`tfservo transform --runner ray`).

A pool of model actors (one loaded ModelService per actor, `--max-concurrent-transforms` model
calls at a time in each) does everything. With two objects or more per actor, each actor takes
whole objects, a few at a time, and runs them through the local engine's threads from reading
to writing (distributed.transform_objects): only names and outcomes cross between processes.
With fewer, one object's requests are spread over every actor: an actor splits each object into
requests (a streaming generator, so a large object's requests reach the other actors while it
is still being read), the requests go to the least busy actor, and when an object's answers
are all in, an actor writes its .out atomically (distributed.write_object). Splitting and
writing run in the actors' own I/O threads: as Ray tasks each needed a worker process of its
own, started on demand, which cost more than the model calls on small jobs. Request and answer bytes move between workers through
Ray's object store; the driver sees only small progress records. Without an address it
starts a local cluster on this machine's cores and stops it at the end.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
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
from tfservo.batch.engines.driver import DriverRun, job_bundle_versions, start_driver_run
from tfservo.batch.job import JobError, TransformJob
from tfservo.batch.records import Wire
from tfservo.batch.sources import InputObject
from tfservo.batch.state import ObjectOutcome, RecordFailure, TransformSummary
from tfservo.core.extras import require

__all__ = ["RayPasses", "RaySettings", "actor_shape", "run_ray_transform"]

log = logging.getLogger("tfservo.batch")

WHOLE_SHARE = 16  # objects an actor takes at once when actors take whole objects
_SHAPES = {True: "whole objects on each actor", False: "each object's requests spread over the actors"}


@dataclass
class RaySettings:
    """--ray-address and --workers: where the job runs and on how many model actors."""

    address: str | None = None  # None: the cluster this process is connected to, else a new local one
    workers: int = 0  # model actors; 0: one per CPU of the cluster (actor_shape)
    options: dict[str, object] = field(default_factory=dict)  # more ray.init() arguments


@contextmanager
def _connected(settings: RaySettings) -> Iterator[Any]:
    """Ray, connected: to `address`, to the cluster this process already joined, or to a new
    local one (stopped at the end)."""
    ray = require("--runner ray", "ray", "ray")
    if ray.is_initialized():
        yield ray
        return
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True, **settings.options}
    if settings.address:
        kwargs["address"] = settings.address
    else:
        kwargs.update(num_cpus=os.cpu_count() or 1, include_dashboard=False)
    try:
        ray.init(**kwargs)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise JobError(f"cannot reach the Ray cluster at {settings.address or 'a new local cluster'}: {exc}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _actor_class(ray: Any, concurrency: int) -> Any:
    """The model worker: an actor holding the model that also splits objects and writes them
    (in its own threads), so no task needs a worker process of its own."""

    @ray.remote(concurrency_groups={"model": concurrency, "io": 2, "whole": 1})
    class ModelWorker:
        def __init__(self, job: TransformJob, cores: int) -> None:
            self.job, self.cores = job, cores  # on_cores(job, cores) already: the driver's _start_actors
            self.invoker = worker_service(job, cores).invoker
            self.id = worker_id()

        def ready(self) -> str:
            return self.id

        @ray.method(concurrency_group="whole")
        def transform(self, objects: list[InputObject], stale: set[str]) -> tuple[list[bytes], str]:
            return [outcome_json(o) for o in transform_objects(self.job, objects, stale, self.cores)], self.id

        @ray.method(concurrency_group="io")
        def split(self, obj: InputObject) -> Iterator[Wire | Tail]:
            for _rel, part in split_object(obj, self.job):
                yield part  # request wires, then the Tail

        @ray.method(num_returns=2, concurrency_group="model")
        def call(self, rel: str, wire: Wire) -> tuple[Wire, Wire]:
            part = Request.unwire(wire)
            answer = call_request(self.invoker, self.job, rel, part)
            ok = answer.failure is None
            return (answer.records if ok else 0, part.nbytes, self.id), answer.wire()

        @ray.method(concurrency_group="io")
        def write(self, tail: Tail, stale: set[str], *answers: Wire) -> bytes:
            return write_wired(self.job, tail, answers, stale)

    return ModelWorker


class _Object:
    """One object in flight: its request generator, answers so far, and its tail once read."""

    def __init__(self, obj: InputObject) -> None:
        self.obj = obj
        self.held: object = None  # the newest ref: a request, or the Tail when the generator ends
        self.answers: list[object] = []
        self.waiting = 0  # answers not in yet
        self.tail: Tail | None = None


def run_ray_transform(
    job: TransformJob, settings: RaySettings | None = None, *, progress: str = "auto",
    progress_interval: float = 10.0,
) -> TransformSummary:
    """Run `job` on Ray and wait for it: the local engine's outputs, report and summary, with the
    workers that took part named in the summary."""
    chosen = settings or RaySettings()
    return run_on_cluster(
        job, lambda: _connected(chosen), lambda engine, run: _drive(engine, run, chosen, progress, progress_interval)
    )


class RayPasses:
    """`transform --follow --runner ray`: the connection and the model actors kept from one pass
    to the next, each pass a driver run over the objects that landed (see tfservo.batch.engines.follow)."""

    def __init__(self, job: TransformJob, settings: RaySettings | None = None) -> None:
        self.settings = settings or RaySettings()
        self.versions = job_bundle_versions(job)
        self._exit = ExitStack()
        try:
            self._ray = self._exit.enter_context(_connected(self.settings))
            self._actors, self._calls = _start_actors(self._ray, job, self.settings)
            self._exit.callback(lambda: [self._ray.kill(actor) for actor in self._actors])
        except BaseException:
            self._exit.close()
            raise

    def run(self, job: TransformJob, objects: list[InputObject]) -> TransformSummary:
        run = start_driver_run(job, objects, self.versions)
        if not run.todo:
            return run.finish([])
        outcomes, workers = _drive_objects(self._ray, run, self._actors, self._calls, "none", 10.0)
        return run.finish(outcomes, workers)

    def close(self) -> None:
        self._exit.close()


def actor_shape(node_cpus: list[float], workers: int) -> tuple[int, float]:
    """How many model actors, and the CPUs each asks Ray for: one actor per CPU of the cluster
    unless --workers says; then the cluster's CPUs shared among them, in shares that the nodes
    can hold (else an actor waits for a node forever), a fraction of one when there are more
    actors than CPUs."""
    cpus = [int(n) for n in node_cpus if n >= 1]
    total = sum(cpus)
    if not total:
        raise JobError("the Ray cluster has no node with a whole CPU for the model workers; add CPUs to its nodes")
    if not workers:
        return max(1, total), 1.0
    for share in range(min(total // workers, max(cpus, default=0)), 0, -1):
        if sum(n // share for n in cpus) >= workers:
            return workers, float(share)
    per_cpu = 2  # more actors than CPUs: each takes 1/per_cpu of one
    while sum(n * per_cpu for n in cpus) < workers:
        per_cpu += 1
    return workers, 1 / per_cpu


def _start_actors(ray: Any, job: TransformJob, settings: RaySettings) -> tuple[list[Any], int]:
    """The model actors, each with the model loaded, and the model calls each makes at a time
    (one per CPU it owns, unless the job says)."""
    nodes = [node.get("Resources", {}).get("CPU", 0) for node in ray.nodes() if node.get("Alive")]
    count, cpus = actor_shape(nodes, settings.workers)
    cores = max(1, int(cpus))
    job = on_cores(job, cores)
    ModelWorker = _actor_class(ray, job.concurrency)
    actors = [ModelWorker.options(num_cpus=cpus, scheduling_strategy="SPREAD").remote(job, cores) for _ in range(count)]
    try:
        ids = ray.get([a.ready.remote() for a in actors])
    except ray.exceptions.RayActorError as exc:
        for actor in actors:
            ray.kill(actor)
        raise JobError(f"the Ray workers could not load {job.model}: {exc}") from None
    log.info("%d model workers on Ray, %g CPU%s each (%s)", count, cpus, "" if cpus == 1 else "s", ", ".join(sorted(set(ids))))
    return actors, job.concurrency


def _drive(
    ray: Any, run: DriverRun, settings: RaySettings, progress_mode: str, interval: float
) -> tuple[list[ObjectOutcome], set[str]]:
    actors, calls = _start_actors(ray, run.job, settings)
    try:
        return _drive_objects(ray, run, actors, calls, progress_mode, interval)
    finally:
        for actor in actors:
            ray.kill(actor)


def _drive_objects(
    ray: Any, run: DriverRun, actors: list[Any], calls: int, progress_mode: str, interval: float
) -> tuple[list[ObjectOutcome], set[str]]:
    """The objects of `run` through the actors (each making `calls` model calls at a time):
    whole objects on each, or split, called and written on them."""
    whole = takes_whole_objects(len(run.todo), len(actors))
    log.info("running %d objects on Ray (%s)", len(run.todo), _SHAPES[whole])
    meter = run.progress(progress_mode, interval)
    try:
        if whole:
            return _drive_whole_objects(ray, run, actors, meter)
        return _drive_split_objects(ray, run, actors, calls, meter)
    except ray.exceptions.RayError as exc:
        raise JobError(f"the Ray job failed: {exc}; run the same command again to resume") from None
    finally:
        meter.close()


def _drive_split_objects(
    ray: Any, run: DriverRun, actors: list[Any], calls: int, meter: Any
) -> tuple[list[ObjectOutcome], set[str]]:
    """Each object split on an actor, its requests answered by the least busy actors, its
    answers written on another."""
    count = len(actors)
    busy = {i: 0 for i in range(count)}
    limit = 2 * calls  # requests queued per actor before splitting waits
    objects: dict[object, _Object] = {}  # generator → its object
    answers: dict[object, tuple[_Object, int]] = {}  # progress ref → (object, actor)
    writes: dict[object, _Object] = {}
    outcomes: list[ObjectOutcome] = []
    workers: set[str] = set()
    todo = list(run.todo)
    window = max(2, count)  # objects being split at once
    turn = itertools.count()  # splits and writes go round the actors

    def dispatch(state: _Object, ref: object) -> None:
        actor = min(busy, key=busy.__getitem__)
        busy[actor] += 1
        meta, answer = actors[actor].call.remote(state.obj.rel, ref)
        state.answers.append(answer)
        state.waiting += 1
        answers[meta] = (state, actor)

    def maybe_write(state: _Object) -> None:
        if state.tail is not None and state.waiting == 0:
            writer = actors[next(turn) % count]
            writes[writer.write.remote(state.tail, run.stale_dead_letters, *state.answers)] = state

    while todo or objects or answers or writes:
        while todo and len(objects) < window:
            obj = todo.pop(0)
            objects[actors[next(turn) % count].split.remote(obj)] = _Object(obj)
        room = sum(busy.values()) < limit * count
        waitables = [*(g for g in objects if room), *answers, *writes]
        if not waitables:  # every actor is full: wait for an answer
            waitables = list(answers)
        ready, _ = ray.wait(waitables, num_returns=1, timeout=1.0)
        if ready:  # and whatever else is ready now, handled together
            ready, _ = ray.wait(waitables, num_returns=len(waitables), timeout=0)
        metas = [r for r in ready if r in answers]
        for ref, (records, nbytes, worker) in zip(metas, ray.get(metas)):
            state, actor = answers.pop(ref)
            busy[actor] -= 1
            state.waiting -= 1
            workers.add(worker)
            meter.add(records=records, nbytes=nbytes)
            maybe_write(state)
        written = [r for r in ready if r in writes]
        for ref, data in zip(written, ray.get(written)):
            outcome = outcome_from_json(writes.pop(ref).obj, data)
            outcomes.append(outcome)
            meter.add(objects=1, failed=int(outcome.status != "done"))
        for ref in ready:
            if ref in objects:
                _advance(ray, ref, objects, dispatch, maybe_write)
    return outcomes, workers


def _drive_whole_objects(ray: Any, run: DriverRun, actors: list[Any], meter: Any) -> tuple[list[ObjectOutcome], set[str]]:
    """Each actor transforms whole objects, in shares of a few (about four shares per actor, for
    balance, and at most WHOLE_SHARE objects, for progress), two shares queued on each."""
    todo, count = list(run.todo), len(actors)
    size = max(1, min(WHOLE_SHARE, math.ceil(len(todo) / (4 * count))))
    shares = [todo[i:i + size] for i in range(0, len(todo), size)]
    queued = {i: 0 for i in range(count)}
    calls: dict[object, tuple[int, list[InputObject]]] = {}
    outcomes: list[ObjectOutcome] = []
    workers: set[str] = set()
    while shares or calls:
        for actor in range(count):
            while shares and queued[actor] < 2:
                share = shares.pop(0)
                calls[actors[actor].transform.remote(share, run.stale_dead_letters)] = (actor, share)
                queued[actor] += 1
        ready, _ = ray.wait(list(calls), num_returns=1, timeout=1.0)
        for ref in ready:
            actor, share = calls.pop(ref)
            queued[actor] -= 1
            answers, worker = ray.get(ref)
            workers.add(worker)
            for obj, data in zip(share, answers):
                outcome = outcome_from_json(obj, data)
                outcomes.append(outcome)
                meter.add(objects=1, failed=int(outcome.status != "done"), records=outcome.records,
                          nbytes=obj.size or 0)
    return outcomes, workers


def _advance(ray: Any, generator: Any, objects: dict[Any, _Object], dispatch: Any, maybe_write: Any) -> None:
    """Take the next item of an object's split generator: the item before it was a request (sent
    to a model worker); when the generator ends, the one held back is the object's Tail."""
    state = objects[generator]
    try:
        ref = next(generator)
    except StopIteration:
        del objects[generator]
        state.tail = _tail(ray, state)
        maybe_write(state)
        return
    if state.held is not None:
        dispatch(state, state.held)
    state.held = ref


def _tail(ray: Any, state: _Object) -> Tail:
    """The object's Tail, the last item its split task yielded; when the task died instead
    (a worker lost), a failed Tail counting the requests already sent."""
    try:
        item = ray.get(state.held) if state.held is not None else None
    except ray.exceptions.RayError as exc:
        return Tail(state.obj, len(state.answers), False, RecordFailure("the object", f"reading it on Ray failed: {exc}"))
    if isinstance(item, Tail):
        return item
    return Tail(state.obj, len(state.answers), False, RecordFailure("the object", "its split task ended without its tail"))
