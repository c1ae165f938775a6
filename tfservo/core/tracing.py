"""OpenTelemetry traces, configured by the standard OTEL_* variables: off, and free, unless set.

`configure` (called by the service factory, so in every process that runs a model) turns
tracing on when `OTEL_TRACES_EXPORTER` names an exporter or an OTLP endpoint variable is set,
and `OTEL_SDK_DISABLED` is not true. The SDK itself reads the rest: the endpoint, protocol,
headers and timeouts of the OTLP exporter, `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_TRACES_SAMPLER` and its argument, the batch processor's `OTEL_BSP_*`.
`TFSERVO_TRACE_DETAIL=phases` adds the spans of each request's phases (decode, encode, the
batch queue's wait and the batched run) to the default three: the door's server span, the model
call and the handler's own functions.

A request the sampler does not sample costs the decision and nothing else: no span object, no
attributes, no context of ours (a caller's traceparent is still made current, so the handler's
own calls carry it on).

Everything else in tfservo opens spans through this module's functions, which return a shared
no-op when tracing is off: one global check per call. Only this module reads OTEL_*, and passes
what it read to its export process (core.trace_export).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING, TypeAlias

from tfservo.core import environment
from tfservo.core.trace_export import ChildExport, exporter_class, phase_wire

if TYPE_CHECKING:  # the SDK is the [otel] extra: imported only once tracing is on
    import grpc
    from opentelemetry.context import Context
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.sampling import Sampler
    from opentelemetry.trace import Span, SpanContext, Status, Tracer
    from opentelemetry.util.types import AttributeValue

__all__ = [
    "Parent",
    "activate",
    "configure",
    "context_of",
    "end",
    "from_traceparent",
    "enabled",
    "error_status",
    "flush",
    "header_carrier",
    "now_ns",
    "parent",
    "phases",
    "record",
    "server_span",
    "span",
    "start",
    "traced_channel",
    "traceparent",
    "wanted",
]

log = logging.getLogger("tfservo.tracing")

_TRACER: Tracer | None = None  # the SDK's once tracing is on; None: every function here is a no-op
_PROVIDER: TracerProvider | None = None
_PHASES: _PhaseRecorder | None = None
_LOCK = threading.Lock()
_CONFIGURED = False
_NULL: AbstractContextManager[None] = nullcontext()
# Whether this request's server span was sampled; None where no server span of ours decided
# (gRPC's interceptor spans, batch threads, transforms): there the current span tells.
_SAMPLED: ContextVar[bool | None] = ContextVar("tfservo_trace_sampled", default=None)
_ON = ("otlp", "console")
DETAIL_VARIABLE = "TFSERVO_TRACE_DETAIL"  # "phases": the spans of each request's phases too
_DETAIL = False

Parent: TypeAlias = "Context | None"  # captured by `parent()`; None when tracing is off
Attributes: TypeAlias = "Mapping[str, AttributeValue]"


def enabled() -> bool:
    return _TRACER is not None


def phases() -> bool:
    """Whether the spans of each request's phases are recorded (TFSERVO_TRACE_DETAIL=phases)."""
    return _DETAIL


def wanted(environ: Mapping[str, str]) -> list[str]:
    """The exporters the environment asks for ([]: tracing off)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if named:
        exporters = [e.strip() for e in named.split(",") if e.strip() and e.strip() != "none"]
        unknown = [e for e in exporters if e not in _ON]
        if unknown:
            raise ValueError(
                f"OTEL_TRACES_EXPORTER={named!r}: tfservo exports traces with {', '.join(_ON)} or none, "
                f"not {', '.join(unknown)}; use otlp and point OTEL_EXPORTER_OTLP_ENDPOINT at a collector"
            )
        return exporters
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return ["otlp"]
    return []


def configure(environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on in this process if the environment asks for it (once; later calls only
    answer whether it is on)."""
    global _TRACER, _PROVIDER, _CONFIGURED, _PHASES, _DETAIL
    with _LOCK:
        if _CONFIGURED:
            return _TRACER is not None
        _CONFIGURED = True
        env = environment.current() if environ is None else environ
        exporters = wanted(env)
        if not exporters:
            return False
        detail = env.get(DETAIL_VARIABLE, "requests").strip().lower() or "requests"
        if detail not in ("requests", "phases"):
            raise ValueError(f"{DETAIL_VARIABLE}={detail!r}: use requests (the default: server, model and handler "
                             "spans) or phases (also decode, encode and the batch's queue and run)")
        _DETAIL = detail == "phases"
        from tfservo.core.extras import require

        for module in ("opentelemetry.sdk", "opentelemetry.instrumentation.requests"):
            require("tracing (turned on by the OTEL_* variables; unset them to serve without)", "otel", module)
        from opentelemetry import trace
        from opentelemetry.instrumentation.requests import RequestsInstrumentor
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create()
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: "tfservo"}))
        provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
        for name in exporters:
            exporter_class(name, env)  # a wrong protocol fails here, in this process
        # OTLP is encoded and sent by a child process (core.trace_export: the GIL stays with
        # requests); the console exporter prints from this one, under the SDK's batch processor.
        otlp = [name for name in exporters if name != "console"]
        child = ChildExport(otlp, resource, env) if otlp else None
        console: list[SpanProcessor] = [
            BatchSpanProcessor(exporter_class(name, env)()) for name in exporters if name == "console"
        ]
        if child is not None:  # a SpanProcessor by its methods: the SDK is not imported before here
            provider.add_span_processor(child)  # type: ignore[arg-type]
        for processor in console:
            provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
        # A handler's own requests.post(context.rest_uri, ...) carries the invocation's traceparent.
        RequestsInstrumentor().instrument(tracer_provider=provider)
        _PROVIDER = provider
        _TRACER = provider.get_tracer("tfservo")
        _PHASES = _PhaseRecorder(resource, child, console, provider.sampler)
        log.info("tracing on: %s exporter(s), service %s", ",".join(exporters), resource.attributes[SERVICE_NAME])
        return True


def on_dropped(count: Callable[[], None]) -> None:
    """Have `count()` called for each span dropped because the export queue was full (a
    worker's metric); nothing when tracing is off or exports from this process only."""
    if _PHASES is not None and _PHASES.child is not None:
        _PHASES.child.on_drop = count


def flush(timeout_seconds: float = 5.0) -> None:
    """Export the spans still queued (before a process ends or a job reports done)."""
    if _PROVIDER is not None:
        _PROVIDER.force_flush(int(timeout_seconds * 1000))


def span(name: str, attributes: Attributes | None = None, *, leaf: bool = False) -> AbstractContextManager[None]:
    """A child span of the current one for the duration of a `with` block (a no-op when off,
    or when the current trace is not sampled). `leaf`: nothing inside opens a span (decoding,
    encoding), so it is recorded without being made current — at half the cost; the phases'
    spans are only recorded with TFSERVO_TRACE_DETAIL=phases."""
    if _PHASES is None or _SAMPLED.get() is False or (leaf and not _DETAIL):
        return _NULL
    if leaf and _PHASES.child is not None and not _PHASES.processors:
        return _Leaf(_PHASES, name, attributes)
    return _Phase(_PHASES, name, attributes)


class _PhaseRecorder:
    """Records the spans of a request's phases (decode, model, encode, handlers, batching) at a
    quarter of the SDK's per-span cost: each is made current as a non-recording span with its
    own id (so spans opened inside it, the instrumented `requests` calls, have it as parent) and
    handed to the span processors as a finished ReadableSpan when it ends. It is always a child
    of a span the sampler already decided (the HTTP server span, gRPC's, a transform's job): a
    phase follows its parent's sampled flag, as the default parent-based sampler would."""

    def __init__(self, resource: Resource, child: ChildExport | None, processors: list[SpanProcessor],
                 sampler: Sampler) -> None:
        from opentelemetry import context, propagate, trace
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace.sampling import Decision
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.resource = resource
        self.child = child  # takes plain values, no ReadableSpan
        self.processors = processors
        self.scope = InstrumentationScope("tfservo")
        self.context, self.trace, self.readable = context, trace, ReadableSpan  # bound once: a phase is hot
        self.unset = trace.Status(trace.StatusCode.UNSET)
        self.sampled_flags = trace.TraceFlags(trace.TraceFlags.SAMPLED)
        self.unsampled_flags = trace.TraceFlags(trace.TraceFlags.DEFAULT)
        self.no_state = trace.TraceState()
        self.server_kind = trace.SpanKind.SERVER
        self.sampler = sampler  # the provider's, from OTEL_TRACES_SAMPLER: decides each server span
        self.sample = Decision.RECORD_AND_SAMPLE
        self.root = context.Context()  # no parent: what a server span without a traceparent continues
        self.extract = propagate.extract

    def finish(self, name: str, context: SpanContext, parent: SpanContext | None, attributes: Attributes | None,
               start_ns: int, end_ns: int, error: str | None = None, kind: int = 0) -> None:
        if self.child is not None:
            self.child.add(phase_wire(name, context, context.span_id, parent, attributes, start_ns, end_ns, error, kind))
        if self.processors:
            status = self.unset if error is None else self.trace.Status(self.trace.StatusCode.ERROR, error)
            done = self.readable(name, context, parent, self.resource, attributes, status=status,
                                 kind=self.trace.SpanKind(kind), start_time=start_ns, end_time=end_ns,
                                 instrumentation_scope=self.scope)
            for processor in self.processors:
                processor.on_end(done)

    def child_of(self, parent: SpanContext) -> SpanContext | None:
        """A new span context in `parent`'s trace (None when there is no sampled parent)."""
        if not parent.is_valid or not parent.trace_flags.sampled:
            return None
        return self.trace.SpanContext(
            parent.trace_id, random.getrandbits(64) or 1, False, parent.trace_flags, parent.trace_state
        )


class _Phase:
    """One phase's span for a `with` block (see _PhaseRecorder)."""

    __slots__ = ("recorder", "name", "attributes", "context", "parent", "token", "start_ns")

    def __init__(self, recorder: _PhaseRecorder, name: str, attributes: Attributes | None) -> None:
        self.recorder, self.name, self.attributes = recorder, name, attributes
        self.token: object = None

    def __enter__(self) -> None:
        recorder = self.recorder
        trace = recorder.trace
        self.parent = trace.get_current_span().get_span_context()
        self.context = recorder.child_of(self.parent)
        if self.context is not None:
            self.token = recorder.context.attach(trace.set_span_in_context(trace.NonRecordingSpan(self.context)))
            self.start_ns = time.time_ns()

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        if self.token is None or self.context is None:
            return
        end_ns = time.time_ns()
        self.recorder.context.detach(self.token)
        failed = f"{type(error).__name__}: {error}" if error is not None else None
        self.recorder.finish(self.name, self.context, self.parent, self.attributes, self.start_ns, end_ns, failed)


class _Leaf:
    """A phase nothing is opened under: its parent and times recorded, its wire built at the end
    (only with export in the child process, which takes plain values)."""

    __slots__ = ("recorder", "name", "attributes", "parent", "start_ns")

    def __init__(self, recorder: _PhaseRecorder, name: str, attributes: Attributes | None) -> None:
        self.recorder, self.name, self.attributes = recorder, name, attributes
        self.parent: SpanContext | None = None

    def __enter__(self) -> None:
        parent = self.recorder.trace.get_current_span().get_span_context()
        if parent.is_valid and parent.trace_flags.sampled:
            self.parent = parent
            self.start_ns = time.time_ns()

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        parent = self.parent
        if parent is None:
            return
        end_ns = time.time_ns()
        failed = f"{type(error).__name__}: {error}" if error is not None else None
        child = self.recorder.child
        assert child is not None  # a leaf is recorded only for export in the child process (span())
        child.add(phase_wire(self.name, parent, random.getrandbits(64) or 1, parent, self.attributes, self.start_ns,
                             end_ns, failed))


def server_span(
    name: str, carrier: Mapping[str, str], attributes: Callable[[], dict[str, AttributeValue]]
) -> _ServerSpan:
    """A SERVER span continuing the caller's trace from its W3C `traceparent` in `carrier`, its
    attributes from `attributes()` (called only for a sampled request; the span adds to them).

    The provider's sampler (OTEL_TRACES_SAMPLER) decides first, through its public
    `should_sample` (without attributes: the standard samplers decide on the trace id and the
    parent), and the span is recorded as the phases are, at a third of the SDK's cost per
    request; a request it does not sample makes no span, attributes or context of ours."""
    recorder = _PHASES
    assert recorder is not None  # only called with tracing on
    return _ServerSpan(recorder, name, carrier, attributes)


class _ServerSpan:
    """A recorded SERVER span (see server_span), and what the HTTP edge sets on it: attributes,
    an error status, its final name; `sampled` once entered."""

    __slots__ = ("recorder", "name", "carrier", "make_attributes", "attributes", "error", "parent", "context",
                 "sampled", "token", "sampled_token", "start_ns")

    def __init__(self, recorder: _PhaseRecorder, name: str, carrier: Mapping[str, str],
                 attributes: Callable[[], dict[str, AttributeValue]]) -> None:
        self.recorder, self.name, self.carrier, self.make_attributes = recorder, name, carrier, attributes
        self.error: str | None = None
        self.attributes: dict[str, AttributeValue] = {}

    def __enter__(self) -> _ServerSpan:
        recorder = self.recorder
        trace = recorder.trace
        # No trace header (most requests): nothing to extract, a new trace.
        parent = None
        if self.carrier:
            within = recorder.extract(self.carrier)
            parent = trace.get_current_span(within).get_span_context()
        if parent is not None and parent.is_valid:
            self.parent, trace_id, state = parent, parent.trace_id, parent.trace_state
        else:
            within, self.parent, trace_id, state = recorder.root, None, random.getrandbits(128) or 1, recorder.no_state
        decided = recorder.sampler.should_sample(within, trace_id, self.name, recorder.server_kind, None)
        self.sampled = decided.decision is recorder.sample
        if not self.sampled:  # the caller's context goes on to the handler's calls; nothing of ours is made
            self.token = recorder.context.attach(within) if self.parent is not None else None
            self.sampled_token = _SAMPLED.set(False)
            return self
        self.attributes = self.make_attributes()
        if decided.attributes:
            self.attributes.update(decided.attributes)
        flags = recorder.sampled_flags if self.sampled else recorder.unsampled_flags
        self.context = trace.SpanContext(trace_id, random.getrandbits(64) or 1, False, flags,
                                         decided.trace_state if decided.trace_state is not None else state)
        self.token = recorder.context.attach(trace.set_span_in_context(trace.NonRecordingSpan(self.context)))
        self.sampled_token = _SAMPLED.set(self.sampled)
        self.start_ns = time.time_ns()
        return self

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        recorder = self.recorder
        _SAMPLED.reset(self.sampled_token)
        if not self.sampled:
            if self.token is not None:
                recorder.context.detach(self.token)
            return
        end_ns = time.time_ns()
        if error is not None:
            self.error = f"{type(error).__name__}: {error}"
        recorder.context.detach(self.token)
        if self.sampled:
            recorder.finish(self.name, self.context, self.parent, self.attributes, self.start_ns, end_ns,
                            self.error, kind=recorder.server_kind.value)

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self.attributes[key] = value

    def set_status(self, status: Status) -> None:
        if status.status_code.name == "ERROR":
            self.error = status.description or ""

    def update_name(self, name: str) -> None:
        self.name = name


def error_status(description: str) -> Status:
    """The ERROR status a span is set to when its request failed on the server's side."""
    from opentelemetry.trace import Status, StatusCode

    return Status(StatusCode.ERROR, description)


def parent() -> Parent:
    """The current context, to parent spans recorded later on another thread (None when off).
    Also for a trace not sampled: where the caller makes it current again (a batch's callback on
    the loop, run in another request's context), it keeps that request's spans out."""
    if _PHASES is None:
        return None
    current: Context = _PHASES.context.get_current()
    return current


def record(
    name: str, within: Parent, start_ns: int, end_ns: int, attributes: Attributes, *, phase: bool = False,
) -> Parent:
    """A span already over (the batch queue's wait, a batched model run), under `within`; the
    context to record its own children under (None when off or not sampled). `phase`: one of
    a request's phases, recorded only with TFSERVO_TRACE_DETAIL=phases."""
    if _PHASES is None or within is None or (phase and not _DETAIL):
        return None
    parent = _PHASES.trace.get_current_span(within).get_span_context()
    child = _PHASES.child_of(parent)
    if child is None:
        return None
    _PHASES.finish(name, child, parent, attributes, start_ns, end_ns)
    within_child: Context = _PHASES.trace.set_span_in_context(_PHASES.trace.NonRecordingSpan(child))
    return within_child


def now_ns() -> int:
    return time.time_ns()


def start(
    name: str, within: Parent = None, attributes: Attributes | None = None, start_ns: int | None = None,
) -> Span | None:
    """A span begun now (or at `start_ns`) and ended by `end`, perhaps on another thread, under
    `within` (None: the current context); not made current. None when tracing is off."""
    if _TRACER is None:
        return None
    return _TRACER.start_span(name, context=within, attributes=attributes, start_time=start_ns)


def end(span: Span | None, error: str | None = None) -> None:
    """End a span from `start` (ERROR status with `error`, if given)."""
    if span is None:
        return
    if error is not None:
        span.set_status(error_status(error))
    span.end()


def context_of(span: Span | None) -> Parent:
    """The context whose current span is `span`, to parent others under it (None when off)."""
    if span is None:
        return None
    from opentelemetry import trace

    return trace.set_span_in_context(span)


def activate(within: Parent) -> AbstractContextManager[None]:
    """Make `within` the current context for a `with` block (nothing when it is None)."""
    return _NULL if within is None else _Activated(within)


class _Activated:
    """`within` made current; whether it is sampled is its own span's to say (not the flag of
    whichever request this thread's context was copied from)."""

    __slots__ = ("within", "token", "sampled_token")

    def __init__(self, within: Context) -> None:
        self.within = within

    def __enter__(self) -> None:
        assert _PHASES is not None  # a context to activate exists only with tracing on
        self.token = _PHASES.context.attach(self.within)
        self.sampled_token = _SAMPLED.set(None)

    def __exit__(self, *exc: object) -> None:
        assert _PHASES is not None
        _SAMPLED.reset(self.sampled_token)
        _PHASES.context.detach(self.token)


def traceparent(within: Parent) -> str | None:
    """`within` as a W3C traceparent (for another process), or None."""
    if within is None:
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=within)
    return carrier.get("traceparent")


def from_traceparent(value: str | None) -> Parent:
    """The context a traceparent from another process continues (None when off or not given)."""
    if _TRACER is None or not value:
        return None
    from opentelemetry import propagate

    return propagate.extract({"traceparent": value})


def traced_channel(channel: grpc.Channel) -> grpc.Channel:
    """`channel` sending the current trace's traceparent with each call (as is when off)."""
    if _TRACER is None:
        return channel
    from opentelemetry.instrumentation import grpc as instrumentation
    from opentelemetry.instrumentation.grpc import grpcext

    interceptor = instrumentation.client_interceptor(tracer_provider=_PROVIDER)  # type: ignore[no-untyped-call, unused-ignore]
    traced: grpc.Channel = grpcext.intercept_channel(channel, interceptor)  # type: ignore[no-untyped-call, unused-ignore]
    return traced


def header_carrier(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """ASGI headers as the text map the propagator reads (only the trace headers are kept)."""
    return {
        key.decode("latin-1"): value.decode("latin-1")
        for key, value in headers
        if key in (b"traceparent", b"tracestate", b"baggage")
    }
