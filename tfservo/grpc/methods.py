"""A gRPC service's methods, declared once each — name, messages and the API-key scope it
needs — and served from that declaration on the asyncio server: tolerant request decoding, a
servicer's plain methods run in the loop's thread pool (`threaded`), and the management methods
behind the ManagementGate (UNIMPLEMENTED while off, one audit line per call)."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tfservo.auth.audit import ManagementGate
from tfservo.capture.taps import Taps
from tfservo.capture.writer import CaptureEvent

__all__ = ["Method", "SyncContext", "UndecodableRequest", "method_scopes", "peer_address", "service_handler", "threaded"]


@dataclass(frozen=True)
class Method:
    """One unary method. `scope`: what an API key needs to call it (auth.keys.SCOPES), None: open
    (health probes); "manage" methods answer only while model management is on; `inference`
    methods are captured and payload-logged as their HTTP twins are."""

    name: str
    request: object
    response: Any
    scope: str | None = "read"
    inference: bool = False  # an inference method: its payloads reach the taps of "inference" routes


class UndecodableRequest:
    """What a request's bytes became when they are not the message the method takes."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def _tolerant(message_class: Any) -> Callable[[bytes], Any]:
    """A request deserializer that never raises: grpc answers INTERNAL for a deserializer that
    does, where a client's bad bytes are INVALID_ARGUMENT."""
    name = message_class.DESCRIPTOR.full_name

    def parse(data: bytes) -> object:
        try:
            return message_class.FromString(data)
        except Exception as exc:
            return UndecodableRequest(f"The request is not a valid {name} ({exc}); send a serialized {name}")

    return parse


class _Aborted(Exception):
    """SyncContext.abort: the status the call ends with, set on the loop once the thread returns."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code, self.details = code, details


class SyncContext:
    """An asyncio call's context as a method running in a thread uses it (the calls of
    grpc.ServicerContext that tfservo's plain methods make): `abort` raises."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self._code: grpc.StatusCode | None = None

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code = code
        raise _Aborted(code, details)

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def time_remaining(self) -> float | None:
        return self._context.time_remaining()  # type: ignore[no-any-return, unused-ignore]

    def cancelled(self) -> bool:
        return self._context.cancelled()  # type: ignore[no-any-return, unused-ignore]

    def peer(self) -> str:
        return self._context.peer()  # type: ignore[no-any-return, unused-ignore]

    def invocation_metadata(self) -> Any:
        return self._context.invocation_metadata()


def threaded(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """A plain method as an asyncio one: run in the loop's thread pool (in the caller's context:
    deadline, trace, key) with a SyncContext; its abort ends the call on the loop."""

    async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
        call = contextvars.copy_context()
        try:
            return await asyncio.get_running_loop().run_in_executor(None, call.run, behavior, request, SyncContext(context))
        except _Aborted as exc:
            aborted = exc
        await context.abort(aborted.code, aborted.details)

    return run


def method_scopes(service: str, methods: Sequence[Method]) -> dict[str, str | None]:
    """Full method name → the scope it needs."""
    return {f"/{service}/{method.name}": method.scope for method in methods}


def service_handler(
    service: str, servicer: object, methods: Sequence[Method], gate: ManagementGate | None = None,
    taps: Taps | None = None,
) -> grpc.GenericRpcHandler:
    """The methods of `service` on `servicer` (an attribute per method name: a coroutine
    function runs on the loop, a plain one in the loop's thread pool); `taps`: where inference
    methods' payloads go (Data Capture, the payload log)."""
    handlers = {}
    for method in methods:
        behavior = getattr(servicer, method.name)
        if not inspect.iscoroutinefunction(behavior):
            if method.scope == "manage" and gate is not None:
                behavior = _gated(behavior, gate, f"/{service}/{method.name}")
            behavior = threaded(behavior)
        if method.inference and taps:
            behavior = _captured(behavior, taps)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            behavior, request_deserializer=_tolerant(method.request), response_serializer=method.response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service, handlers)


def _captured(
    behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]], taps: Taps,
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """An inference method whose sampled calls reach the taps: the request and answer as their
    serialized messages (Data Capture writes them BASE64), an error as its status and details."""

    async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
        taking = taps.taking("inference")
        if not taking or isinstance(request, UndecodableRequest):
            return await behavior(request, context)
        arrived = time.time()
        body, kind = request.SerializeToString(), _proto_type(request)
        try:
            response = await behavior(request, context)
        except BaseException:
            code, details = _status(context)
            Taps.deliver(taking, CaptureEvent(body, kind, f"{code}: {details}".encode(), "text/plain", None, arrived), False)
            raise
        Taps.deliver(taking, CaptureEvent(body, kind, response.SerializeToString(), _proto_type(response), None, arrived), True)
        return response

    return run


def _proto_type(message: Any) -> str:
    """A message's content type in a capture: protobuf, naming its message type."""
    return f"application/x-protobuf; messageType={message.DESCRIPTOR.full_name}"


def _status(context: grpc.aio.ServicerContext) -> tuple[str, str]:
    """The code and details a call ended with (after an abort)."""
    code = context.code() if hasattr(context, "code") else None
    details = context.details() if hasattr(context, "details") else None
    name = code.name if isinstance(code, grpc.StatusCode) else "INTERNAL"
    return name, details.decode() if isinstance(details, bytes) else str(details or "")


def _gated(
    behavior: Callable[[Any, SyncContext], Any], gate: ManagementGate, action: str
) -> Callable[[Any, SyncContext], Any]:
    if not gate.open:
        def off(request: Any, context: SyncContext) -> Any:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, gate.off_message)

        return off

    def audited(request: Any, context: SyncContext) -> Any:
        peer, model = peer_address(context.peer()), _model_named(request)
        try:
            response = behavior(request, context)
        except BaseException:
            code = context.code()
            gate.record("grpc", peer, action, model, code.name if isinstance(code, grpc.StatusCode) else "INTERNAL")
            raise
        status = getattr(response, "status", None)  # TF Serving's ReloadConfigResponse carries its outcome
        failed = getattr(status, "error_code", 0)
        gate.record("grpc", peer, action, model, grpc.StatusCode.OK.name if not failed else f"error_code={failed}")
        return response

    return audited


def _model_named(request: object) -> str | None:
    """The model(s) a management request names: V2's model_name, the names in a ModelServerConfig."""
    name = getattr(request, "model_name", None)
    if isinstance(name, str) and name:
        return name
    config = getattr(request, "config", None)
    listed = getattr(getattr(config, "model_config_list", None), "config", None)
    return ",".join(entry.name for entry in listed) or None if listed is not None else None


def peer_address(peer: str) -> str:
    """A gRPC peer ("ipv4:1.2.3.4:5678", "ipv6:[::1]:5678", "unix:...") as its address alone."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer
