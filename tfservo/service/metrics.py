"""Prometheus metrics and per-request access logs for REST and gRPC.

`Metrics` holds the metrics of one server: `http.metrics_edge.instrument` wraps the HTTP app
with it (counting every request and answering `GET /metrics`), `scope` is the gRPC servicers' RequestScope,
`model_event` goes to ServiceOptions.on_event and `batch_hook` to the batcher's on_batch.

With several worker processes, set PROMETHEUS_MULTIPROC_DIR to an empty directory shared by
the workers (prometheus_client's multiprocess mode): every worker's /metrics then reports the
sum over all of them, and per-process gauges carry a `pid` label.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tfservo.core import environment
from tfservo.core.errors import Code, FailedPrecondition
from tfservo.core.request_labels import RequestLabels, tracking
from tfservo.core.request_labels import current as current_labels
from tfservo.core.status import http_status
from tfservo.models.hooks import ModelHooks
from tfservo.models.servables import ServableVersion, State
from tfservo.service.metric_tally import Tally
from tfservo.service.model_statistics import INFERENCE_METHODS, ModelStatistics
from tfservo.service.tfs_metrics import TFServingMetrics

if TYPE_CHECKING:
    from tfservo.service.variants import EndpointHooks

__all__ = [
    "BATCH_BUCKETS",
    "LATENCY_BUCKETS",
    "METRICS_PATH",
    "MULTIPROC_ENV",
    "access_level",
    "mark_worker_dead",
    "Metrics",
]

access_log = logging.getLogger("tfservo.access")
log = logging.getLogger("tfservo.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
METRICS_PATH = "/metrics"

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)




class Metrics:
    """The Prometheus metrics of one server (of all its workers, in multiprocess mode)."""

    def __init__(self, multiprocess_dir: str | None = None) -> None:
        self.statistics = ModelStatistics()  # V2's statistics extension, from the same records
        self.multiprocess_dir = multiprocess_dir if multiprocess_dir is not None else environment.variable(MULTIPROC_ENV)
        if self.multiprocess_dir:
            if not os.path.isdir(self.multiprocess_dir):
                raise FailedPrecondition(
                    f"{MULTIPROC_ENV}={self.multiprocess_dir} is not a directory; create it (empty) "
                    "before starting the server"
                )
            if not _multiprocess_values():
                # prometheus_client picks its value store when it is imported; the serving
                # process (or the workers' supervisor) sets the variable before that.
                raise FailedPrecondition(
                    f"{MULTIPROC_ENV}={self.multiprocess_dir} was set after prometheus_client was "
                    "imported; set it in the environment before the server starts"
                )
        # No *_created series: noise for dashboards. (prometheus_client's functions are untyped.)
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call, unused-ignore]
        # Metrics live in a private registry: in multiprocess mode /metrics reads the workers'
        # files instead, and two servers in one process (tests) don't collide.
        self.registry = CollectorRegistry(auto_describe=True)
        if not self.multiprocess_dir:
            prometheus_client.ProcessCollector(registry=self.registry)
            prometheus_client.PlatformCollector(registry=self.registry)
        reg = self.registry
        request_labels = ["protocol", "model", "version", "method", "route"]
        self.requests = Counter(
            "tfservo_requests", "Requests answered, by protocol, model, version, method, route and status "
            "(HTTP status code, or gRPC status name)", [*request_labels, "status"], registry=reg,
        )
        self.latency = Histogram(
            "tfservo_request_duration_seconds", "Time from a request's arrival to its answer",
            request_labels, buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.in_flight = Gauge(
            "tfservo_requests_in_flight", "Requests being answered now", ["protocol"],
            multiprocess_mode="livesum", registry=reg,
        )
        # The per-request and per-batch updates, written in bulk off the request path.
        self.tally = Tally()
        # Each label set's children, found once: prometheus_client's labels() checks and
        # converts every value on every call (a few µs a request, three times).
        self._answered: dict[tuple[str, ...], tuple[Any, Any]] = {}
        self._busy_children: dict[str, Any] = {}
        self._in_flight: dict[str, Any] = {}
        self._batches: dict[str, tuple[Any, Any, Any, Any]] = {}  # model → its batch metrics' children
        self.model_state = Gauge(
            "tfservo_model_state", "1 for the state each model version is in (TF Serving's states), else 0",
            ["model", "version", "state"], multiprocess_mode="liveall", registry=reg,
        )
        self.model_load_seconds = Gauge(
            "tfservo_model_load_seconds", "Seconds the model version took to load",
            ["model", "version"], multiprocess_mode="liveall", registry=reg,
        )
        self.pool_queued = Gauge(
            "tfservo_pool_queued", "Requests waiting for a thread of a pool (tfservo-call: TF Serving's REST "
            "API; tfservo-invoke: invocations; tfservo-grpc-call: gRPC Predict and ModelInfer) because their model "
            "holds its share of it",
            ["pool"], multiprocess_mode="livesum", registry=reg,
        )
        self.model_loads = Counter(
            "tfservo_model_loads", "Model versions loaded (a code reload loads none)", ["model", "version"], registry=reg,
        )
        self.model_load_failures = Counter(
            "tfservo_model_load_failures", "Model versions that failed to load", ["model", "version"], registry=reg,
        )
        # Labelled by served model name only (the batcher's own): a bounded label set.
        self.batch_size = Histogram(
            "tfservo_batch_size", "Rows in each batch the batcher ran (before padding), by model",
            ["model"], buckets=BATCH_BUCKETS, registry=reg,
        )
        self.batch_padding = Counter(
            "tfservo_batch_padding_rows", "Rows added to batches to reach an allowed batch size, by model",
            ["model"], registry=reg,
        )
        # The saturation signal: rate() of it is the share of time the model computes (1.0: one
        # call at a time, back to back), batched or not; what a scaling rule divides by its target.
        self.busy_seconds = Counter(
            "tfservo_model_busy_seconds", "Seconds the model spent computing (batched and unbatched calls), by model",
            ["model"], registry=reg,
        )
        # Per model, for a scaling rule: requests holding one of its versions now (queued for
        # a thread or the batcher, or computing), and rows in its batcher's queue.
        self.model_in_flight = Gauge(
            "tfservo_model_requests_in_flight", "Requests holding a version of the model now (waiting or computing), by model",
            ["model"], multiprocess_mode="livesum", registry=reg,
        )
        self.batch_queued = Gauge(
            "tfservo_batch_queued_rows", "Rows waiting in the model's batch queue for a batch thread, by model",
            ["model"], multiprocess_mode="livesum", registry=reg,
        )
        self._held: dict[str, Any] = {}
        self._queued: dict[str, Any] = {}
        self.batch_seconds = Histogram(
            "tfservo_batch_run_seconds", "Time the model took to run one batch, by model",
            ["model"], buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.timeouts = Counter(
            "tfservo_timeouts", "Requests answered 504 because their time limit passed, by route and model",
            ["route", "model"], registry=reg,
        )
        self.auth_refusals = Counter(
            "tfservo_auth_refused", "Requests refused for their API key (--api-keys), by reason "
            "(unauthenticated: none or unknown; forbidden: not its scope or model)", ["reason"], registry=reg,
        )
        self.management_actions = Counter(
            "tfservo_management_actions", "Model-management calls (load, unload, reload config), by door and "
            "outcome (an HTTP status or a gRPC code)", ["door", "outcome"], registry=reg,
        )
        self.async_backlog = Gauge(
            "tfservo_async_backlog", "Asynchronous requests waiting in the queue (SageMaker's ApproximateBacklogSize)",
            multiprocess_mode="livemax", registry=reg,
        )
        self.async_in_flight = Gauge(
            "tfservo_async_in_flight", "Asynchronous requests running now, across the workers",
            multiprocess_mode="livemax", registry=reg,
        )
        self.async_waited = Histogram(
            "tfservo_async_backlog_seconds", "Time asynchronous requests waited in the queue before they ran",
            buckets=(0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 21600), registry=reg,
        )
        self.async_outcomes = Counter(
            "tfservo_async_requests", "Asynchronous requests ended, by outcome (completed, failed, expired), and those kept queued because "
            "their answer or error could not be written (deferred: a full disk, a store away; they run again)",
            ["outcome"], registry=reg,
        )
        self.worker_memory = Gauge(
            "tfservo_worker_resident_bytes", "Resident memory of the worker process",
            multiprocess_mode="liveall", registry=reg,
        )
        self.worker_memory_limit = Gauge(
            "tfservo_worker_memory_limit_bytes", "Resident memory past which a worker is replaced "
            "(--max-worker-memory-mb)", multiprocess_mode="livemax", registry=reg,
        )
        self.capture_lines = Counter(
            "tfservo_capture_lines", "Invocations written to data capture files", registry=reg,
        )
        self.capture_dropped = Counter(
            "tfservo_capture_dropped", "Sampled invocations not captured, by reason: queue (the writer fell "
            "behind), disk (capture paused: its disk is too full), error (a write failed)", ["reason"], registry=reg,
        )
        self.capture_paused = Gauge(
            "tfservo_capture_paused", "1 while data capture is paused because its disk is too full",
            multiprocess_mode="livemax", registry=reg,
        )
        self.capture_uploads = Counter(
            "tfservo_capture_uploads", "Capture files uploaded to S3, by result (ok, failed)", ["result"], registry=reg,
        )
        self.payload_events = Counter(
            "tfservo_payload_log_events", "Payload log events, by result: sent, failed (the receiver "
            "answered an error or could not be reached), dropped (the queue was full)", ["result"], registry=reg,
        )
        self.spans_dropped = Counter(
            "tfservo_trace_spans_dropped", "Spans not exported because the export queue was full "
            "(OTEL_BSP_MAX_QUEUE_SIZE): the export process could not keep up; sample fewer requests", registry=reg,
        )
        self.variant_invocations = Counter(
            "tfservo_variant_invocations", "Invocations answered by each production variant, by status",
            ["variant", "status"], registry=reg,
        )
        self.variant_latency = Histogram(
            "tfservo_variant_duration_seconds", "Time each production variant took to answer an invocation",
            ["variant"], buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.shadow_copies = Counter(
            "tfservo_shadow_copies", "Copies of requests for a shadow variant, by outcome: sent (answered), failed "
            "(it answered an error), dropped (its queue was full: --shadow-queue)", ["variant", "outcome"], registry=reg,
        )
        self.container_latency = Histogram(
            "tfservo_pipeline_container_duration_seconds", "Time each container of an inference pipeline took",
            ["container"], buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.container_failures = Counter(
            "tfservo_pipeline_container_failures", "Invocations a pipeline's container answered with an error",
            ["container"], registry=reg,
        )
        self.on_answered: Callable[[], None] | None = None  # the worker's watch counts answers
        self._server_wide: list[Collector] = []  # the supervisor's counts, the shared throttle
        self._failures_counted: set[int] = set()
        # TF Serving's metric names (--monitoring_config_file), when asked for
        self.tfs: TFServingMetrics | None = None
        self.tfs_path: str | None = None

    def close(self) -> None:
        """Write the updates still gathered (a stopping worker)."""
        self.tally.close()

    def count_replacements(self, counts: Callable[[], Mapping[str, int]], reasons: Sequence[str]) -> None:
        """Report the supervisor's counts of replaced workers (it alone knows of those that died)."""
        self._shared(_Replacements(counts, reasons))

    def report_throttle(self, counts: Callable[[], tuple[int, int]]) -> None:
        """Report the failed-authentication throttle's state (the server's: its table is shared)."""
        self._shared(_Throttle(counts))

    def _shared(self, collector: Collector) -> None:
        """A collector of the server's own values, the same in every worker: exposed once, not summed."""
        self._server_wide.append(collector)
        if not self.multiprocess_dir:
            self.registry.register(collector)

    def serve_tf_serving_names(self, path: str) -> None:
        """Also keep TF Serving's metrics and answer GET `path` with them."""
        self.tfs, self.tfs_path = TFServingMetrics(), path

    # -- hooks -----------------------------------------------------------------------------------

    def model_event(self, sv: ServableVersion) -> None:
        """ServiceOptions.on_event: a model version was loaded, failed to load or was unloaded."""
        model, version = sv.model_name, str(sv.version)
        for state in State:
            self.model_state.labels(model, version, state.value).set(1 if sv.state is state else 0)
        if sv.state is State.AVAILABLE and sv.load_seconds is not None:
            self.model_load_seconds.labels(model, version).set(sv.load_seconds)
            self.model_loads.labels(model, version).inc()
            if self.tfs is not None:
                self.tfs.load(sv.path, True, sv.load_seconds)
        if sv.state is State.END and sv.error and id(sv) not in self._failures_counted:
            # Unloading a failed version reports it again: count each version object once.
            self._failures_counted.add(id(sv))
            weakref.finalize(sv, self._failures_counted.discard, id(sv))
            self.model_load_failures.labels(model, version).inc()
            if self.tfs is not None:
                self.tfs.load(sv.path, False, None)

    def capture_event(self, kind: str, count: int) -> None:
        """The capture writer's and payload logger's on_event: lines written or dropped, pauses,
        uploads, events sent."""
        if kind == "captured":
            self.capture_lines.inc(count)
        elif kind.startswith("dropped_"):
            self.capture_dropped.labels(kind.removeprefix("dropped_")).inc(count)
        elif kind in ("paused", "resumed"):
            self.capture_paused.set(1 if kind == "paused" else 0)
        elif kind.startswith("payload_"):
            self.payload_events.labels(kind.removeprefix("payload_")).inc(count)
        elif kind in ("uploaded", "upload_failed"):
            self.capture_uploads.labels("ok" if kind == "uploaded" else "failed").inc(count)

    def span_dropped(self) -> None:
        """Tracing's on_dropped: one span dropped past the export queue."""
        self.tally.inc(self.spans_dropped)

    def auth_refused(self, reason: str) -> None:
        self.auth_refusals.labels(reason).inc()

    def async_event(self, event: str, seconds: float) -> None:
        """AsyncRunner's on_event: a request taken from the queue after `seconds`, or ended."""
        if event == "claimed":
            self.async_waited.observe(seconds)
        else:
            self.async_outcomes.labels(event).inc()

    def async_backlog_counts(self, counts: dict[str, int]) -> None:
        """AsyncRunner's on_backlog: the queue's requests by state."""
        self.async_backlog.set(counts.get("queued", 0))
        self.async_in_flight.set(counts.get("running", 0))

    def management_action(self, door: str, outcome: str) -> None:
        self.management_actions.labels(door, outcome).inc()

    def pool_queue(self, pool: str, change: int) -> None:
        """CallPlacement.on_queue: a call started (+1) or stopped (-1) waiting for a thread."""
        self.pool_queued.labels(pool).inc(change)

    def batch_hook(self, model: str, real: int, padded: int, seconds: float, queued: float) -> None:
        """The batcher's on_batch: a batch of `model` with `real` rows ran as `padded` rows in
        `seconds`, its first row having waited `queued` seconds."""
        children = self._batches.get(model)
        if children is None:  # labels() costs more than the update itself: once per model
            children = self._batches[model] = (
                self.batch_size.labels(model), self.batch_padding.labels(model), self.batch_seconds.labels(model),
                self._busy(model),
            )
        tally = self.tally
        self.statistics.executed(model, None, real, seconds, queued)
        tally.observe(children[0], real)
        if padded > real:
            tally.inc(children[1], padded - real)
        tally.observe(children[2], seconds)
        tally.inc(children[3], seconds)
        if self.tfs is not None:
            self.tfs.batch(model, real, padded, queued)
            self.tfs.runtime(model, "predict", seconds)

    def _busy(self, model: str) -> Any:
        child = self._busy_children.get(model)
        if child is None:  # labels() once per model (see _answered)
            child = self._busy_children[model] = self.busy_seconds.labels(model)
        return child

    def run_hook(self, model: str, seconds: float) -> None:
        """One unbatched model call of `model` took `seconds` (TF Serving's runtime latency)."""
        labels = current_labels()
        self.tally.inc(self._busy(model), seconds)
        self.statistics.executed(model, (labels.version or None) if labels is not None else None, 0, seconds)
        if self.tfs is not None:
            self.tfs.runtime(model, (labels.method if labels is not None else None) or "predict", seconds)

    def hold_hook(self, model: str, change: int) -> None:
        """A request took (+1) or gave back (-1) a handle on a version of `model`."""
        child = self._held.get(model)
        if child is None:
            child = self._held[model] = self.model_in_flight.labels(model)
        self.tally.inc(child, change)

    def queue_hook(self, model: str, change: int) -> None:
        """`change` rows joined (+) or left (-) a batch queue of `model`."""
        child = self._queued.get(model)
        if child is None:
            child = self._queued[model] = self.batch_queued.labels(model)
        self.tally.inc(child, change)

    def model_hooks(self) -> ModelHooks:
        """The hooks the model layer reports to (ModelService, its manager and batchers)."""
        return ModelHooks(
            on_event=self.model_event, on_batch=self.batch_hook, on_run=self.run_hook,
            on_hold=self.hold_hook, on_queue=self.queue_hook,
        )

    def endpoint_hooks(self) -> EndpointHooks:
        """The hooks production variants, shadows and pipeline containers report to."""
        from tfservo.service.variants import EndpointHooks

        def variant(name: str, status: int, seconds: float) -> None:
            self.variant_invocations.labels(name, str(status)).inc()
            self.variant_latency.labels(name).observe(seconds)

        def container(name: str, seconds: float, ok: bool) -> None:
            self.container_latency.labels(name).observe(seconds)
            if not ok:
                self.container_failures.labels(name).inc()

        return EndpointHooks(on_variant=variant, on_shadow=lambda name, outcome: self.shadow_copies.labels(
            name, outcome).inc(), on_container=container)

    def timeout(self, route: str, model: str | None, seconds: float) -> None:
        """A request's time limit passed: counted and logged (one line naming route and model)."""
        self.timeouts.labels(route, model or "").inc()
        log.warning("timeout: %s for model %s passed its limit of %g s; answered 504", route, model or "-", seconds)

    def scope(self, route: str, method: str) -> Any:
        """A RequestScope for TF Serving's gRPC servicers: labels current while the call runs, recorded after."""
        return self.request("grpc", RequestLabels(route=route, method=method), transport="grpc")

    def v2_scope(self, route: str, method: str) -> Any:
        """The RequestScope of the Open Inference Protocol's gRPC servicer (protocol label v2)."""
        return self.request("v2", RequestLabels(route=route, method=method), transport="grpc")

    def request(self, protocol: str, labels: RequestLabels, transport: str = "http") -> _Tracked:
        """Track one request: in flight while inside, then counted, timed and logged with `labels`.

        `protocol` is the label (http, grpc, or v2 for the Open Inference Protocol on either
        transport; its routes tell which); `transport` picks error codes' spelling."""
        return _Tracked(self, protocol, labels, transport, self.in_flight_child(protocol))

    def in_flight_child(self, protocol: str) -> Any:
        """The in-flight gauge's child for `protocol` (found once)."""
        gauge = self._in_flight.get(protocol)
        if gauge is None:
            gauge = self._in_flight[protocol] = self.in_flight.labels(protocol)
        return gauge

    def record(self, protocol: str, labels: RequestLabels, seconds: float, transport: str, at: int | None) -> None:
        """Count one answered request and log it at level `at` (`access_level()`: info with
        --access-log, else debug; None: not logged), one line to logger tfservo.access."""
        key = (protocol, labels.model, labels.version, labels.method, labels.route, labels.status)
        children = self._answered.get(key)
        if children is None:
            children = self._answered[key] = (self.requests.labels(*key), self.latency.labels(*key[:5]))
        self.tally.inc(children[0])
        self.tally.observe(children[1], seconds)
        if labels.model and labels.method in INFERENCE_METHODS:
            self.statistics.answered(labels.model, labels.version, labels.status in ("200", "OK"), seconds)
        if self.tfs is not None and labels.model:
            self.tfs.request(
                labels.model, labels.method or "predict", "GRPC" if transport == "grpc" else "REST",
                _code_name(labels.status), seconds,
            )
        if self.on_answered is not None:
            self.on_answered()
        if at is not None:
            fields = {
                "protocol": protocol, "verb": labels.verb or None, "path": labels.path or labels.route or None,
                "route": labels.route or None, "method": labels.method or None, "model": labels.model or None,
                "version": labels.version or None, "status": labels.status or None, "bytes": labels.bytes_out,
                "ms": round(seconds * 1e3, 2), "inference_id": labels.inference_id or None,
            }
            access_log.log(
                at,
                " ".join(f"{key}={'-' if value is None else value}" for key, value in fields.items()),
                extra={"fields": {key: value for key, value in fields.items() if value is not None}},
            )

    # -- exposition ------------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The metrics in Prometheus text format (all workers' in multiprocess mode; this
        worker's updates written first, the others' as of their last bulk write)."""
        self.tally.flush()
        if self.multiprocess_dir:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=self.multiprocess_dir)  # type: ignore[no-untyped-call, unused-ignore]
            for collector in self._server_wide:  # the same in every worker: not summed over them
                registry.register(collector)
            return prometheus_client.generate_latest(registry)
        return prometheus_client.generate_latest(self.registry)



class _Throttle(Collector):
    """tfservo_auth_throttle_peers{state}: client addresses with failed authentications counted
    now, and those made to wait now (the server's, across its workers)."""

    def __init__(self, counts: Callable[[], tuple[int, int]]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "tfservo_auth_throttle_peers", "Client addresses the failed-authentication throttle holds: "
            "counted (failures within the last minute) and waiting (refused with 429 until their wait ends)",
            labels=["state"],
        )
        counted, waiting = self.counts()
        family.add_metric(["counted"], counted)
        family.add_metric(["waiting"], waiting)
        yield family


class _Replacements(Collector):
    """tfservo_worker_replacements_total{reason}: the supervisor's counts, as this worker last heard them."""

    def __init__(self, counts: Callable[[], Mapping[str, int]], reasons: Sequence[str]) -> None:
        self.counts = counts
        self.reasons = reasons

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "tfservo_worker_replacements", "Workers replaced, by reason: memory (--max-worker-memory-mb), "
            "requests (--max-requests), stuck (a call past twice its time limit), died (exited or was killed)",
            labels=["reason"],
        )
        counts = self.counts()
        for reason in self.reasons:
            family.add_metric([reason], counts.get(reason, 0))
        yield family


_CODE_OF_HTTP = {http_status(code): code.name for code in reversed(Code)}
_CODE_OF_HTTP.update({200: "OK", 500: "INTERNAL", 400: "INVALID_ARGUMENT"})


def access_level() -> int | None:
    """The level request lines are logged at (info with --access-log, else debug), or None
    when they would not show."""
    at = logging.INFO if access_log.level == logging.INFO else logging.DEBUG
    return at if access_log.isEnabledFor(at) else None


def _code_name(status: str | None) -> str:
    """A request's status as TF Serving's canonical code name (HTTP statuses mapped back)."""
    if not status:
        return "UNKNOWN"
    if status.isdigit():
        return _CODE_OF_HTTP.get(int(status), "UNKNOWN")
    return status


def _multiprocess_values() -> bool:
    """Whether prometheus_client stores values in files shared by processes (multiprocess mode)."""
    return values.ValueClass is not values.MutexValue


def mark_worker_dead(pid: int, multiprocess_dir: str | None = None) -> None:
    """For a parent of worker processes: drop a dead worker's live gauges (multiprocess mode)."""
    path = multiprocess_dir or environment.variable(MULTIPROC_ENV)
    if path:
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call, unused-ignore]


class _Tracked(tracking):
    """One request tracked by `Metrics.request`: its labels current while inside (`tracking`),
    then counted, timed and logged (a class, not a generator: it wraps every request)."""

    __slots__ = ("metrics", "protocol", "transport", "gauge", "started")

    def __init__(self, metrics: Metrics, protocol: str, labels: RequestLabels, transport: str, gauge: Any) -> None:
        super().__init__(labels)
        self.metrics, self.protocol, self.transport, self.gauge = metrics, protocol, transport, gauge

    def __enter__(self) -> RequestLabels:
        self.metrics.tally.inc(self.gauge)
        self.started = time.perf_counter()
        return super().__enter__()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        super().__exit__(kind, error, tb)
        labels = self.labels
        if kind is not None:
            labels.status = labels.status or ("500" if self.transport == "http" else "UNKNOWN")
        self.metrics.tally.inc(self.gauge, -1)
        self.metrics.record(self.protocol, labels, time.perf_counter() - self.started, self.transport, access_level())
