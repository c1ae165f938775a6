"""One runtime per serving process, built once and handed to every door.

`build_runtime` assembles what every door of a server shares — the service (models,
handlers, invoker), the metrics, the management gate, the access check with the server's one
throttle, Data Capture and the payload log, V2's data plane, multi-model and Target-Model
loading — so HTTP, gRPC and the loopback endpoints handlers call never build their own.
A door parses its protocol, asks the runtime, and writes its protocol's answer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tfservo.auth.access import Access
from tfservo.auth.audit import ManagementGate
from tfservo.auth.throttle import THROTTLE_TABLE, FailureThrottle
from tfservo.capture.taps import KINDS, Tap, Taps
from tfservo.capture.writer import CaptureEvent
from tfservo.core import tracing
from tfservo.core.settings import Settings
from tfservo.service.call_placement import CallPlacement
from tfservo.service.decode_budget import BUDGET_TABLE, DecodeBudget, default_decoding_bytes
from tfservo.service.factory import ModelService, build_service
from tfservo.service.metrics import Metrics
from tfservo.service.shared_memory import REGIONS_TABLE, SharedMemoryRegions
from tfservo.service.v2_dataplane import V2DataPlane
from tfservo.service.variants import ShadowAnswer, VariantInvoker

if TYPE_CHECKING:
    from tfservo.service.multi_model import MultiModelEndpoint
    from tfservo.service.target_models import TargetModels

__all__ = ["Placements", "Runtime", "build_runtime", "placements_for", "runtime_of"]

_THREADS = 64  # model calls in flight at once per pool


@dataclass
class Placements:
    """Where each door's model calls run, made once per serving process (call_placement decides
    loop or thread per call): TF Serving's and V2's REST calls, SageMaker's invocations (their
    own threads: a handler may call back into REST), and gRPC's calls."""

    calls: CallPlacement
    invocations: CallPlacement
    grpc: CallPlacement

    def close(self) -> None:
        for placement in (self.calls, self.invocations, self.grpc):
            placement.close()


def placements_for(settings: Settings, batched: bool) -> Placements:
    """The placements of one process: without batching quick small calls run on the loop; with
    it every call goes to threads (small predicts are queued for their batch instead)."""

    def pool(name: str) -> CallPlacement:
        return CallPlacement(_THREADS, name, inline=not batched, max_queued=settings.max_queued_per_model)

    return Placements(pool("tfservo-call"), pool("tfservo-invoke"), pool("tfservo-grpc-call"))


@dataclass
class Runtime:
    """What every door of one serving process shares (see the module's docstring)."""

    service: ModelService
    metrics: Metrics
    gate: ManagementGate
    access: Access
    taps: Taps
    v2: V2DataPlane
    placements: Placements
    budget: DecodeBudget
    multi_model: MultiModelEndpoint | None = None
    targets: TargetModels | None = None

    @property
    def settings(self) -> Settings:
        return self.service.settings

    def close(self) -> None:
        """The capture sinks' last lines, the access tables, the call threads; the service is its
        owner's to close."""
        self.taps.close()
        self.access.close()
        self.placements.close()
        self.budget.close()
        self.v2.close()


def build_runtime(
    settings: Settings, port: int, *, metrics: Metrics | None = None, shared_dir: str | None = None,
) -> Runtime:
    """The runtime of a serving process on `port`: its service built through the one factory;
    `shared_dir`: the supervisor's folder of shared tables (failed authentications counted once per
    server across its workers), None for a server of one process."""
    metrics = metrics or Metrics()
    if settings.monitoring_config_file:
        from tfservo.core.tfs_configs import read_monitoring_config

        monitoring = read_monitoring_config(settings.monitoring_config_file)
        if monitoring.enable:
            metrics.serve_tf_serving_names(monitoring.path)
    service = build_service(settings, hooks=metrics.model_hooks(), endpoint_hooks=metrics.endpoint_hooks(),
                            shared_dir=shared_dir)
    tracing.on_dropped(metrics.span_dropped)
    local_host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    service.rest_base = f"http://{local_host}:{port}"
    multi_model = targets = None
    if settings.multi_model:
        from tfservo.service.multi_model import MultiModelEndpoint
        from tfservo.service.target_models import TargetModels

        multi_model = MultiModelEndpoint(service, settings.model_root, memory_factor=settings.memory_factor)
        targets = TargetModels(
            multi_model,
            memory_budget_bytes=int(settings.mme_memory_mb * 2**20) if settings.mme_memory_mb > 0 else None,
            archive_limits=settings.archive_limits,
        )
    taps = _taps(settings, service, port, metrics)
    if isinstance(service.invoker, VariantInvoker) and taps:
        service.invoker.deliver = lambda answer: taps.deliver_copy(_shadow_event(answer), answer.result.ok)
    return Runtime(
        service,
        metrics,
        ManagementGate(settings, metrics.management_action),
        _access(settings, metrics, shared_dir),
        taps,
        V2DataPlane(service.api, service.unavailable_models, repository=multi_model, statistics=metrics.statistics,
                    regions=_regions(settings, shared_dir), batching=service.runners),
        placements_for(settings, service.batches),
        _budget(settings, shared_dir),
        multi_model,
        targets,
    )


def runtime_of(service: ModelService) -> Runtime:
    """A runtime around a service already built, for the loopback endpoints handlers call:
    management off (a handler has no business loading models, and a local process that found
    the port none either), no keys, no capture, metrics of its own (not the server's)."""
    metrics = Metrics(multiprocess_dir="")
    return Runtime(
        service, metrics, ManagementGate(service.settings.replace(management="off")), Access(FailureThrottle()), Taps(),
        V2DataPlane(service.api, service.unavailable_models, statistics=metrics.statistics),
        placements_for(service.settings, service.batches),
        _budget(service.settings, None),
    )


def _shadow_event(answer: ShadowAnswer) -> CaptureEvent:
    """A shadow's answer as a capture event: in the shadow's folder, with its production line's eventId."""
    result = answer.result.encoded()
    return CaptureEvent(answer.request, answer.request_type, result.body, result.content_type, answer.inference_id,
                        answer.arrived, answer.variant, answer.capture_id, answer.seconds)


def _regions(settings: Settings, shared_dir: str | None) -> SharedMemoryRegions | None:
    """The system shared-memory registrations: the server's, in the supervisor's table when it
    has several workers (else this process's); None with --shared-memory off."""
    if settings.shared_memory == "off":
        return None
    return SharedMemoryRegions(os.path.join(shared_dir, REGIONS_TABLE) if shared_dir else None)


def _budget(settings: Settings, shared_dir: str | None) -> DecodeBudget:
    """The bound on bodies being decoded: the server's, counted in the supervisor's table when
    it has several workers (else this process's)."""
    path = os.path.join(shared_dir, BUDGET_TABLE) if shared_dir else None
    limit = settings.max_decoding_bytes or default_decoding_bytes(settings.workers, shared=path is not None)
    return DecodeBudget(limit, path)


def _access(settings: Settings, metrics: Metrics, shared_dir: str | None) -> Access:
    """The key ring (--api-keys) and signature keys (--sigv4-credentials), with one throttle."""
    ring = sigv4 = None
    if settings.api_keys:
        from tfservo.auth.keys import KeyRing

        ring = KeyRing(settings.api_keys)
    if settings.sigv4_credentials:
        from tfservo.auth.replay import REPLAY_TABLE, ReplayCache
        from tfservo.auth.sigv4 import SigV4Verifier

        replay = None
        if settings.sigv4_replay_window > 0:
            replay = ReplayCache(settings.sigv4_replay_window,
                                 os.path.join(shared_dir, REPLAY_TABLE) if shared_dir else None)
        sigv4 = SigV4Verifier(settings.sigv4_credentials, replay=replay)
    throttle = FailureThrottle(limit=settings.auth_failure_limit,
                               path=os.path.join(shared_dir, THROTTLE_TABLE) if shared_dir else None)
    metrics.report_throttle(throttle.counts)
    return Access(throttle, ring, sigv4, metrics.auth_refused, open_runtime=settings.open_runtime_api)


def _taps(settings: Settings, service: ModelService, port: int, metrics: Metrics) -> Taps:
    """Where this process sends its requests' payloads: Data Capture, the payload logger."""
    taps = []
    if settings.data_capture_config:
        from tfservo.capture import CaptureWriter, read_capture_config

        config = read_capture_config(settings.data_capture_config)
        if config.enabled:  # EnableCapture false: no writer process at all
            writer = CaptureWriter(
                config,
                endpoint=settings.endpoint_name or "tfservo",
                variant=settings.variant_name,
                spool=settings.data_capture_buffer,
                file_seconds=settings.data_capture_file_seconds,
                max_disk_percent=settings.data_capture_max_disk_percent,
                on_event=metrics.capture_event,
            )
            kinds = set(KINDS) if settings.data_capture_routes == "all" else {"invocation"}
            taps.append(Tap(writer, frozenset(kinds), config.sampling_percentage))
    if settings.payload_log_url:
        from tfservo.capture.payload_log import PayloadLogger

        logger = PayloadLogger(
            settings.payload_log_url,
            mode=settings.payload_log_mode,
            source=f"http://{settings.host}:{port}/",
            service=settings.endpoint_name or service.default_model() or "tfservo",
            namespace=settings.payload_log_namespace,
            endpoint=settings.variant_name,
            on_event=metrics.capture_event,
        )
        taps.append(Tap(logger, frozenset(KINDS), errors_too=True))
    return Taps(taps)
