"""An OTLP trace receiver the tests run: the collector's gRPC TraceService and its HTTP
`/v1/traces` (protobuf), keeping every span it is sent, from OpenTelemetry's own protos."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from http_receiver import start_receiver
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass
class Span:
    """One received span, flattened: ids in hex, attributes as a plain dict."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    service: str
    attributes: dict[str, object]
    start_ns: int
    end_ns: int


def _value(any_value) -> object:
    return getattr(any_value, any_value.WhichOneof("value")) if any_value.WhichOneof("value") else None


@dataclass
class Receiver:
    spans: list[Span] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next((str(_value(a.value)) for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "")
                for scope_spans in resource_spans.scope_spans:
                    for s in scope_spans.spans:
                        self.spans.append(Span(
                            s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.kind, service,
                            {a.key: _value(a.value) for a in s.attributes}, s.start_time_unix_nano, s.end_time_unix_nano,
                        ))

    def wait_for(self, predicate, timeout: float = 20.0) -> list[Span]:
        """The spans once `predicate(spans)` holds (AssertionError with what came, if it never does)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"spans never matched; received {[(s.name, s.trace_id[:8]) for s in spans]}")


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def Export(self, request, context):
        self.receiver.take(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def start_grpc(receiver: Receiver) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(receiver), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"http://127.0.0.1:{port}"


def start_http(receiver: Receiver) -> tuple[object, str]:
    """The collector's OTLP/HTTP endpoint (POST /v1/traces, protobuf); its base URL has no slash."""

    def take(path: str, headers: dict[str, str], body: bytes) -> int:
        if path != "/v1/traces":
            return 404
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        receiver.take(request)
        return 200

    server, url = start_receiver(take)
    return server, url.rstrip("/")
