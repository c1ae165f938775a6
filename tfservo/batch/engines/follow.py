"""`tfservo transform --follow`: keep watching INPUT and run each new object through the bundle
as it lands, with a batch job's outputs, resume state and semantics — the model loaded once,
every poll a pass over the objects not done yet: of the local engine (LocalPasses), or of the
Ray engine with its model actors kept from pass to pass (tfservo.batch.engines.ray.RayPasses).

An object is taken once it has stood still for a poll (same size in two listings), so a local
file still being written is not read half-way; S3 objects appear whole. Each object's .out is
published whole and, once there, the object is done: across passes, restarts and kill -9
(partial outputs of a killed run are removed by the next pass), every object is transformed once.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from tfservo.batch.engines.local import TransformEngine, list_job_inputs
from tfservo.batch.job import TransformJob
from tfservo.batch.loading import apply_env, load_service
from tfservo.batch.sinks import OutputStore
from tfservo.batch.sources import InputObject, NoInputObjects
from tfservo.batch.state import TransformSummary, bundle_versions, check_settings, job_description
from tfservo.server.loopback import start_handler_endpoints

__all__ = ["FollowMetrics", "LocalPasses", "Passes", "follow_transform"]

log = logging.getLogger("tfservo.batch")


class FollowMetrics:
    """Backlog and lag of a follow run, for its progress lines and, with --metrics-port, as
    Prometheus metrics on http://127.0.0.1:PORT/metrics (a registry of its own: a transform is
    not a server, and nothing else of tfservo's is exported from it)."""

    def __init__(self, port: int | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        self.backlog = Gauge("tfservo_follow_backlog_objects", "Objects listed in INPUT and not transformed yet",
                             registry=self.registry)
        self.lag = Gauge("tfservo_follow_lag_seconds", "How long the oldest object not transformed yet has been "
                         "waiting since it was first listed", registry=self.registry)
        self.objects = Counter("tfservo_follow_objects", "Objects transformed by this run, by outcome",
                               ["outcome"], registry=self.registry)
        self.records = Counter("tfservo_follow_records", "Records answered by this run", registry=self.registry)
        self.polls = Counter("tfservo_follow_polls", "Listings of INPUT", registry=self.registry)
        self._server: Any = None
        if port is not None:
            from prometheus_client import start_http_server

            self._server, _ = start_http_server(port, addr="127.0.0.1", registry=self.registry)
            log.info("follow metrics on http://127.0.0.1:%d/metrics", self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()


class Passes(Protocol):
    """What runs follow mode's passes: the model loaded once, then `run` per poll that finds work."""

    def run(self, job: TransformJob, objects: list[InputObject]) -> TransformSummary: ...

    def close(self) -> None: ...


class LocalPasses:
    """Passes on this machine: the bundle loaded once, the local engine over each pass's objects."""

    def __init__(self, job: TransformJob) -> None:
        apply_env(job.env)
        self.service = load_service(job.model, job.env)
        self.loopback = start_handler_endpoints(self.service)
        self.versions = bundle_versions(self.service.bundles)
        self._engines: dict[bool, TransformEngine] = {}

    def run(self, job: TransformJob, objects: list[InputObject]) -> TransformSummary:
        engine = self._engines.get(job.overwrite)
        if engine is None:
            engine = self._engines[job.overwrite] = TransformEngine(
                job, self.service.invoker, progress="none", versions=self.versions)
        return engine.run(objects)

    def close(self) -> None:
        if self.loopback is not None:
            self.loopback.stop()
        self.service.close()


def follow_transform(job: TransformJob, stop: threading.Event, *, poll_seconds: float = 10.0,
                     metrics: FollowMetrics | None = None,
                     passes: Callable[[TransformJob], Passes] = LocalPasses) -> TransformSummary:
    """Transform INPUT's objects as they land until `stop` is set (the pass running then
    finishes its objects first); the summary of every pass together. Each poll that finds work
    logs the backlog (objects listed, not done) and the lag (how long the oldest has waited)."""
    job = job.validated()
    check_settings(OutputStore(job.state_url), job, job_description(job))  # changed flags stop it before loading
    runner = passes(job)
    total = TransformSummary()
    started = time.monotonic()
    seen: dict[str, int | None] = {}
    taken: set[str] = set()  # objects a pass has had (done, or failed: retried by the next run, not every poll)
    first_listed: dict[str, float] = {}  # object → when a listing first showed it (for the lag)
    metrics = metrics or FollowMetrics()
    try:
        # --overwrite redoes what is there once, at the start; later passes only add new objects
        first, later = job, dataclasses.replace(job, overwrite=False)
        log.info("following %s every %gs; SIGINT or SIGTERM stops once the objects in flight are done",
                 job.input, poll_seconds)
        this = first
        while True:
            listed = _listed(job)
            metrics.polls.inc()
            ready, seen = _settled(listed, seen)
            ready = [obj for obj in ready if obj.rel not in taken]
            for obj in listed:
                first_listed.setdefault(obj.rel, time.monotonic())
            waiting, lag = _backlog(listed, taken, first_listed, metrics)
            if ready:
                log.info("follow: backlog %d object(s), the oldest listed %.1fs ago; transforming %d",
                         waiting, lag, len(ready))
                passed = runner.run(this, ready)
                if this is first:
                    total.skipped = passed.skipped
                this = later
                _add(total, passed)
                taken.update(obj.rel for obj in ready)
                metrics.objects.labels("done").inc(passed.done)
                metrics.objects.labels("failed").inc(len(passed.failed))
                metrics.records.inc(passed.records)
                _backlog(listed, taken, first_listed, metrics)
                if passed.done or passed.failed:
                    log.info("follow: %d new object(s) transformed%s; %d in all", passed.done,
                             f", {len(passed.failed)} failed" if passed.failed else "", total.done)
            if stop.wait(poll_seconds):
                break
    finally:
        runner.close()
        metrics.close()
    total.seconds = time.monotonic() - started
    return total


def _backlog(listed: list[InputObject], taken: set[str], first_listed: dict[str, float],
             metrics: FollowMetrics) -> tuple[int, float]:
    """Objects listed and not taken yet, and how long the oldest of them has waited; both set on
    the metrics."""
    now = time.monotonic()
    waiting = [obj.rel for obj in listed if obj.rel not in taken]
    lag = max((now - first_listed[rel] for rel in waiting), default=0.0)
    metrics.backlog.set(len(waiting))
    metrics.lag.set(lag)
    return len(waiting), lag


def _listed(job: TransformJob) -> list[InputObject]:
    try:
        return list_job_inputs(job)
    except NoInputObjects:
        return []  # not yet


def _settled(
    objects: list[InputObject], before: dict[str, int | None]
) -> tuple[list[InputObject], dict[str, int | None]]:
    """The objects listed with the same size last time (a file still growing waits a poll)."""
    now = {obj.rel: obj.size for obj in objects}
    return [obj for obj in objects if obj.rel in before and before[obj.rel] == obj.size], now


def _add(total: TransformSummary, passed: TransformSummary) -> None:
    total.objects += passed.objects
    total.done += passed.done
    total.records += passed.records
    total.failed.extend(passed.failed)
    total.dead_lettered.extend(passed.dead_lettered)
    total.report = passed.report or total.report
    total.workers = sorted(set(total.workers) | set(passed.workers))
