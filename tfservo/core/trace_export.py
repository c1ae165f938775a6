"""OTLP export in a child process: finished spans leave the serving process as plain tuples.

The SDK's BatchSpanProcessor encodes and sends spans on a thread of the serving process, and
that thread's Python (protobuf encoding, the HTTP or gRPC client) takes the GIL from the
requests: a quarter of the GIL's time at 100 % sampling in a py-spy profile of `tfservo serve`
under load. Here a span processor keeps each finished span as a tuple of plain values and hands
them to a child process (core.offload), which rebuilds ReadableSpans and gives them to the
SDK's own OTLP exporter (endpoint, headers, protocol, timeouts and retries from the OTEL_*
variables as before). OTEL_BSP_SCHEDULE_DELAY (how often batches leave, ms),
OTEL_BSP_MAX_QUEUE_SIZE (spans held before new ones are dropped, and counted) and
OTEL_BSP_MAX_EXPORT_BATCH_SIZE keep their meaning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeAlias

from tfservo.core.offload import Offload

if TYPE_CHECKING:  # the SDK is the [otel] extra
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext
    from opentelemetry.util.types import AttributeValue

__all__ = ["ChildExport", "exporter_class", "phase_wire", "rebuilder", "span_wire"]

log = logging.getLogger("tfservo.tracing")

_DROPS_LOGGED_EVERY = 60.0  # seconds between two lines about dropped spans while drops go on

# (name, trace id, span id, trace flags, trace state, parent span id or 0, parent is remote,
#  kind, start ns, end ns, attributes, status code, status description, events, links, scope)
_Attributes: TypeAlias = "dict[str, AttributeValue]"
Wire: TypeAlias = (
    "tuple[str, int, int, int, str, int, bool, int, int | None, int | None, _Attributes, int, str | None,"
    " tuple[tuple[str, int, _Attributes], ...], tuple[tuple[int, int, int, _Attributes], ...], tuple[str, str | None]]"
)


def span_wire(span: ReadableSpan) -> Wire:
    """A finished SDK ReadableSpan as plain values."""
    ctx, parent, scope = span.context, span.parent, span.instrumentation_scope
    assert ctx is not None  # a finished span has its context
    return (
        span.name, ctx.trace_id, ctx.span_id, int(ctx.trace_flags), ctx.trace_state.to_header(),
        parent.span_id if parent is not None else 0, bool(parent is not None and parent.is_remote),
        span.kind.value, span.start_time, span.end_time, dict(span.attributes or {}),
        span.status.status_code.value, span.status.description,
        tuple((e.name, e.timestamp, dict(e.attributes or {})) for e in span.events),
        tuple((link.context.trace_id, link.context.span_id, int(link.context.trace_flags), dict(link.attributes or {}))
              for link in span.links),
        (scope.name, scope.version) if scope is not None else ("", None),
    )


def phase_wire(name: str, trace: SpanContext, span_id: int, parent: SpanContext | None,
               attributes: Mapping[str, AttributeValue] | None, start_ns: int, end_ns: int, error: str | None,
               kind: int = 0) -> Wire:
    """A span recorded by tracing (a phase, or a server span; `parent` None for a root) as plain
    values, without a ReadableSpan in between. `trace` gives its trace id, flags and state: its
    own context, or its parent's for a leaf phase, which gets no SpanContext of its own."""
    state = trace.trace_state
    return (
        name, trace.trace_id, span_id, int(trace.trace_flags), state.to_header() if state else "",
        parent.span_id if parent is not None else 0, bool(parent is not None and parent.is_remote), kind,
        start_ns, end_ns, dict(attributes or {}), 0 if error is None else 2, error, (), (), ("tfservo", None),
    )


class ChildExport:
    """A span processor (the SDK's SpanProcessor interface) whose exporters run in a child process."""

    def __init__(self, names: list[str], resource: Resource, environ: Mapping[str, str]) -> None:
        self.max_queue = int(_number(environ, "OTEL_BSP_MAX_QUEUE_SIZE", 2048))
        batch = int(_number(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512))
        self.dropped = 0  # spans dropped so far (from any thread: a count for the log, not exact)
        self.reported = 0  # of them, those a log line has counted
        self.reported_at = -_DROPS_LOGGED_EVERY  # monotonic time of that line
        self.on_drop: Callable[[], None] = lambda: None  # each drop (the worker's metric)
        self.offload = Offload(
            _Exporters, (names, dict(environ), dict(resource.attributes), resource.schema_url, batch),
            name="tfservo-trace-export", delay=_number(environ, "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000,
            max_queue=self.max_queue, batch=batch,
        )

    def on_start(self, span: object, parent_context: object = None) -> None:
        pass

    def _on_ending(self, span: object) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            self.add(span_wire(span))

    def add(self, wire: Wire) -> None:
        """Hold a finished span for the next batch; past the queue size it is dropped and counted,
        and a line says so at the first drop and at most once a minute while drops go on."""
        if not self.offload.add(wire):
            self.dropped += 1
            self.on_drop()
            if time.monotonic() - self.reported_at >= _DROPS_LOGGED_EVERY:
                self._report()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Send what is held and wait until the child has exported it; log the spans dropped
        since the last such line."""
        done = self.offload.flush(timeout_millis / 1000)
        self._report()
        return done

    def shutdown(self) -> None:
        self.offload.close()
        self._report()

    def _report(self) -> None:
        """One line for the spans dropped since the last one, if any."""
        dropped = self.dropped
        if dropped > self.reported:
            log.warning(
                "tracing: spans dropped: %d (%d since the start); %d already waited for the export process, which "
                "cannot keep up with this rate; sample fewer requests (OTEL_TRACES_SAMPLER=parentbased_traceidratio, "
                "OTEL_TRACES_SAMPLER_ARG=0.1) or raise OTEL_BSP_MAX_QUEUE_SIZE",
                dropped - self.reported, dropped, self.max_queue)
            self.reported, self.reported_at = dropped, time.monotonic()


class _Exporters:
    """The child's side: spans rebuilt and handed to the SDK's exporters."""

    def __init__(self, reply: object, names: list[str], environ: dict[str, str], resource_attributes: _Attributes,
                 schema_url: str | None, batch: int) -> None:
        self.exporters = [exporter_class(name, environ)() for name in names]
        self.build = rebuilder(resource_attributes, schema_url)
        self.batch = batch

    def handle(self, wires: list[Wire]) -> None:
        spans = [self.build(wire) for wire in wires]
        for start in range(0, len(spans), self.batch):
            for exporter in self.exporters:
                try:
                    exporter.export(spans[start:start + self.batch])
                except Exception:  # an exporter's bug must not end the export of later spans
                    log.exception("exporting spans failed")

    def close(self) -> None:
        for exporter in self.exporters:
            exporter.shutdown()


def rebuilder(resource_attributes: _Attributes, schema_url: str | None = None) -> Callable[[Wire], ReadableSpan]:
    """Plain values → the SDK's ReadableSpan, as the export child rebuilds spans for the SDK's
    exporters (and the observability benchmark times the SDK's encoder on them). Their one
    resource makes its hash once: the SDK's encoder groups spans by resource, and Resource's
    own hash is a JSON dump of its attributes, made again for every span."""
    from opentelemetry.sdk.resources import Resource

    class OneResource(Resource):
        def __init__(self, attributes: _Attributes, schema_url: str | None) -> None:
            super().__init__(attributes, schema_url)
            self.kept_hash = super().__hash__()

        def __hash__(self) -> int:
            return self.kept_hash

    return _Rebuild(OneResource(resource_attributes, schema_url))


class _Rebuild:
    """Plain values → the SDK's ReadableSpan, in the child."""

    def __init__(self, resource: Resource) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.resource, self.trace, self.event, self.readable = resource, trace, Event, ReadableSpan
        self.scope = InstrumentationScope
        self.scopes: dict[tuple[str, str | None], InstrumentationScope] = {}
        self.no_state = trace.TraceState()
        # made once, not per span: most spans share their flags, kind and an unset status
        self.flags = {f: trace.TraceFlags(f) for f in (0, 1)}
        self.kinds = {kind.value: kind for kind in trace.SpanKind}
        self.unset = trace.Status(trace.StatusCode.UNSET)

    def __call__(self, wire: Wire) -> ReadableSpan:
        (name, trace_id, span_id, flags, state, parent_id, parent_remote, kind, start, end, attributes,
         code, description, events, links, scope) = wire
        trace = self.trace
        trace_flags = self.flags[flags] if flags in self.flags else trace.TraceFlags(flags)
        trace_state = trace.TraceState.from_header([state]) if state else self.no_state
        context = trace.SpanContext(trace_id, span_id, False, trace_flags, trace_state)
        parent = trace.SpanContext(trace_id, parent_id, parent_remote, trace_flags, trace_state) if parent_id else None
        if scope not in self.scopes:
            self.scopes[scope] = self.scope(*scope)
        status = self.unset if code == 0 and description is None else trace.Status(trace.StatusCode(code), description)
        return self.readable(
            name, context, parent, self.resource, attributes,
            events=[self.event(n, a, t) for n, t, a in events] if events else (),
            links=[trace.Link(trace.SpanContext(t, s, True, trace.TraceFlags(f)), a) for t, s, f, a in links] if links else (),
            kind=self.kinds[kind], status=status,
            start_time=start, end_time=end, instrumentation_scope=self.scopes[scope],
        )


def exporter_class(name: str, environ: Mapping[str, str]) -> type[SpanExporter]:
    """The SDK's exporter class for an OTEL_TRACES_EXPORTER name (made with no arguments, it
    reads its settings from the OTEL_* variables); ValueError for a protocol it does not know."""
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter
    raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: use grpc or http/protobuf")


def _number(environ: Mapping[str, str], name: str, default: float) -> float:
    try:
        value = float(environ.get(name, "") or default)
    except ValueError:
        log.warning("%s=%r is not a number; using %g", name, environ.get(name), default)
        return default
    return value if value > 0 else default
