"""The one invocation path: bytes + content type + accept + custom attributes → response.

`/invocations`, `/models/{name}/invoke`, `tfservo invoke`, `tfservo transform` and the Beam
handler all call `Invoker.invoke`; none of them converts content or calls handlers itself.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

import requests

from tfservo.codecs import content_types
from tfservo.codecs.json_arrays import NumericTensor
from tfservo.codecs.media_types import CONVERTIBLE_TYPES, JSON, lookup
from tfservo.core import tracing
from tfservo.core.errors import InvalidArgument, ServingError, error_from_response
from tfservo.core.request_labels import note_method, note_model
from tfservo.core.status import error_body, error_status
from tfservo.handlers.bundle_code import Context, Handlers, make_requests_response
from tfservo.models.calls import Answer, Call, answer_rows_slice
from tfservo.service.api import TFServingAPI
from tfservo.service.custom_attributes import CustomAttributes, parse_custom_attributes, requested_model

if TYPE_CHECKING:
    import grpc

    from tfservo.models.servables import ServableHandle

__all__ = ["ComposedInvoker", "error_result", "InvocationResult", "Invoker", "NotRoutable", "PreparedInvocation",
           "result_error"]

log = logging.getLogger("tfservo.invocations")


class NotRoutable(InvalidArgument):
    """A request the endpoint cannot route: a TargetVariant or TargetContainerHostname it lacks, or
    none where one is needed. The endpoint's own refusal, not a model's answer (the runtime API
    answers it as ValidationError)."""


class InvocationResult:
    """What an invocation answers: HTTP-style status, content type, and the body; without a
    handler the body is written from the model's arrays (`answer`) only when first asked for.
    A failed invocation keeps the ServingError it failed with (`error`), so in-process callers
    get the original type and message; only an edge writes its status and body."""

    __slots__ = ("status", "content_type", "answer", "custom_attributes", "error", "one_line", "container", "variant",
                 "capture_id", "_body")

    def __init__(
        self,
        status: int,
        body: bytes | None,
        content_type: str,
        answer: Answer | None = None,
        custom_attributes: str | None = None,
        error: ServingError | None = None,
        one_line: bool = False,
    ) -> None:
        self.status = status
        self.error = error
        self.one_line = one_line  # TF Serving's JSON without its newlines (content_types.one_line_json)
        self.content_type = content_type
        self.answer = answer
        self.custom_attributes = custom_attributes  # a handler's, for X-Amzn-SageMaker-Custom-Attributes
        self.container: str | None = None  # a pipeline's: the container that answered (an error: that failed)
        self.variant: str | None = None  # an endpoint of variants': the production variant that answered
        self.capture_id: str | None = None  # the eventId its capture line and its shadow's share
        self._body = body

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def body(self) -> bytes:
        """The answer in the negotiated content type (ServingError if it cannot be written)."""
        if self._body is None:
            assert self.answer is not None
            with tracing.span("encode", {"tfservo.content_type": self.content_type}, leaf=True):
                self._body = content_types.encode_answer(self.answer, self.content_type, one_line=self.one_line)
        return self._body

    def encoded(self) -> InvocationResult:
        """This result with its body written; an answer that cannot be written is an error result."""
        try:
            self.body  # noqa: B018 - written now
        except ServingError as exc:
            failed = error_result(exc)
            failed.container, failed.variant, failed.capture_id = self.container, self.variant, self.capture_id
            return failed
        return self

    def __repr__(self) -> str:
        return f"InvocationResult({self.status}, {self.content_type!r}, {self._body!r:.80})"


def error_result(exc: ServingError) -> InvocationResult:
    """A ServingError as the protocol's error shape: {"error": "..."} with the mapped status."""
    status = error_status(exc)
    return InvocationResult(status, error_body(exc.message), JSON, error=exc)


def result_error(result: InvocationResult, what: str) -> ServingError:
    """A failed result's ServingError: the original one where the invocation path raised it; an
    error answer of a handler's own making is read back from its status and body."""
    return result.error if result.error is not None else error_from_response(result.status, result.body, what)


class PreparedInvocation(NamedTuple):
    """An invocation without handlers, decoded: the version held for it, the model call, and
    how its answer will be written."""

    handle: ServableHandle
    call: Call
    answer_type: str
    one_line: bool
    # an endpoint of variants': told of the result once it is made (tags it, counts it, copies it
    # to a shadow)
    answered: Callable[[InvocationResult], None] | None = None

    def result(self, answer: Answer) -> InvocationResult:
        """The model's answer as this invocation's result (written when its body is asked for)."""
        return self._told(InvocationResult(200, None, self.answer_type, answer, one_line=self.one_line))

    def written(self, answer: Answer) -> InvocationResult:
        """The result with its body written now, without a span of its own (for a door whose
        queued call is the "encode" span: service.queued_calls); ServingError if it cannot be."""
        body = content_types.encode_answer(answer, self.answer_type, one_line=self.one_line)
        return self._told(InvocationResult(200, body, self.answer_type, answer, one_line=self.one_line))

    def _told(self, result: InvocationResult) -> InvocationResult:
        if self.answered is not None:
            self.answered(result)
        return result


class Invoker:
    """Selects the model, runs the handler or the content conversion, calls TF Serving's API."""

    def __init__(
        self,
        api: TFServingAPI,
        *,
        handlers: Mapping[str, Handlers] | None = None,
        universal_handlers: Handlers | None = None,
        default_model: Callable[[], str | None] | None = None,
        rest_base: Callable[[], str] | None = None,
        grpc_port: Callable[[], int | None] | None = None,
        grpc_socket: Callable[[], str | None] | None = None,
    ) -> None:
        self.api = api
        self.handlers: dict[str, Handlers] = dict(handlers or {})
        self.universal_handlers = universal_handlers
        self._default_model = default_model or (lambda: None)
        self._rest_base = rest_base
        self._grpc_port = grpc_port or (lambda: None)
        self._grpc_socket = grpc_socket or (lambda: None)
        self._channel: tuple[str, object] | None = None
        self._channel_lock = threading.Lock()
        self.label: str | None = None  # a variant's version label: the version of a call naming none

    def has_handlers(self) -> bool:
        return bool(self.handlers) or self.universal_handlers is not None

    def handlers_for(self, model_name: str) -> Handlers | None:
        """A model's own inference.py wins over the bundle's universal one."""
        return self.handlers.get(model_name) or self.universal_handlers

    def invoke(
        self,
        body: bytes,
        content_type: str | None,
        accept: str | None = None,
        custom_attributes: str | None = None,
        model_name: str | None = None,
        *,
        target_variant: str | None = None,
        target_container: str | None = None,
    ) -> InvocationResult:
        """Run one invocation and write its answer; client mistakes come back as 4xx results,
        never as exceptions. `target_variant` (TargetVariant) and `target_container`
        (TargetContainerHostname) are for an endpoint of variants and a Direct pipeline."""
        return self.call(body, content_type, accept, custom_attributes, model_name, target_variant=target_variant,
                         target_container=target_container).encoded()

    def call(
        self,
        body: bytes,
        content_type: str | None,
        accept: str | None = None,
        custom_attributes: str | None = None,
        model_name: str | None = None,
        *,
        target_variant: str | None = None,
        target_container: str | None = None,
    ) -> InvocationResult:
        """Run one invocation, leaving a model's answer as arrays until its body is asked for
        (the transform splits it per record straight from them). One bundle has no containers
        to choose from, and a variant was checked by the door (service.variants decides it)."""
        if target_container is not None:
            return error_result(NotRoutable(
                f"TargetContainerHostname {target_container} names a container, but this endpoint is one container: "
                "Direct invocation needs tfservo serve --pipeline --pipeline-mode direct"))
        try:
            return self._invoke(body, content_type, accept, custom_attributes, model_name)
        except ServingError as exc:
            return error_result(exc)

    def call_many(
        self,
        bodies: Sequence[bytes],
        content_type: str | None,
        accept: str | None = None,
        custom_attributes: str | None = None,
        model_name: str | None = None,
    ) -> list[InvocationResult]:
        """Several invocations with the same headers, each answered as if it came alone, in as
        few model calls as the content type allows: CSV and JSON lines bodies of a model without
        an inference.py go as one request of all their instances, and the answer is cut back
        per body. A body that fails alone fails alone."""
        try:
            attrs = parse_custom_attributes(custom_attributes)
            name = requested_model(model_name, attrs, self._default_model)
            media = content_types.parse_content_type(content_type)
            mergeable = (
                len(bodies) > 1
                and name is not None
                and self.handlers_for(name) is None
                and (spec := lookup(media.essence)) is not None
                and spec.per_line
            )
        except ServingError:
            mergeable = False
        if not mergeable:
            return [self.call(body, content_type, accept, custom_attributes, model_name) for body in bodies]
        results: list[InvocationResult | None] = [None] * len(bodies)
        requests: dict[int, Any] = {}
        for i, body in enumerate(bodies):
            try:
                request = content_types.to_tfs_request(body, content_type)
            except ServingError as exc:
                results[i] = error_result(exc)
                continue
            instances = request.get("instances")
            if list(request) == ["instances"] and isinstance(instances, (list, NumericTensor)) and len(instances):
                requests[i] = instances  # else: a request of its own kind, sent alone below
        merged = content_types.merge_instances(list(requests.values()))
        if merged is not None:
            try:
                accept_types = content_types.parse_accept(accept)
                answer_type = content_types.negotiate(accept_types, CONVERTIBLE_TYPES)
                assert name is not None  # mergeable needs it
                answer = self.api.infer(
                    attrs.method or "predict", name, attrs.version_number, self._label(attrs.version_number),
                    {"instances": merged},
                )
            except ServingError:
                answer = None  # some body is at fault: each is tried alone below, and says so
            if answer is not None:
                start, total = 0, sum(len(instances) for instances in requests.values())
                for i, instances in requests.items():
                    part = answer_rows_slice(answer, start, start + len(instances), total)
                    if part is not None:
                        results[i] = InvocationResult(
                            200, None, answer_type, part, one_line=content_types.one_line_json(accept_types)
                        )
                    start += len(instances)
        return [
            result if result is not None else self.call(bodies[i], content_type, accept, custom_attributes, model_name)
            for i, result in enumerate(results)
        ]

    def prepare(
        self,
        body: bytes,
        content_type: str | None,
        accept: str | None = None,
        custom_attributes: str | None = None,
        model_name: str | None = None,
    ) -> PreparedInvocation | None:
        """The invocation decoded and its version held, for a caller that runs the call itself
        (the HTTP door queues it for its batch without a thread, in its "decode" span); None when
        a handler runs it: use `call`. Client mistakes raise ServingError."""
        _, name, version, method = self._target(custom_attributes, model_name)
        if self.handlers_for(name) is not None:
            return None
        return self._prepare(body, content_type, accept, name, version, method)

    def _target(self, custom_attributes: str | None, model_name: str | None) -> tuple[CustomAttributes, str, int | None, str]:
        """The custom attributes, and the model, version and method the invocation asks for."""
        attrs = parse_custom_attributes(custom_attributes)
        name = requested_model(model_name, attrs, self._default_model)
        if not name and self.universal_handlers is not None and not self.api.manager.model_names():
            name = ""  # a bundle of code alone (a pipeline's conversion container): its handler answers
        elif not name:
            raise InvalidArgument(
                "Invocation request does not contain model name: set tfs-model-name in "
                "X-Amzn-SageMaker-Custom-Attributes or call /models/{name}/invoke"
            )
        version = int(attrs.model_version) if attrs.model_version else None
        method = attrs.method or "predict"
        note_method(method)
        return attrs, name, version, method

    def _prepare(
        self, body: bytes, content_type: str | None, accept: str | None, name: str, version: int | None, method: str
    ) -> PreparedInvocation:
        tfs_request = content_types.to_tfs_request(body, content_type or "")
        accept_types = content_types.parse_accept(accept)
        answer_type = content_types.negotiate(accept_types, CONVERTIBLE_TYPES)
        handle, call = self.api.prepare(method, name, version, self._label(version), tfs_request)
        return PreparedInvocation(handle, call, answer_type, content_types.one_line_json(accept_types))

    def _invoke(
        self,
        body: bytes,
        content_type: str | None,
        accept: str | None,
        custom_attributes: str | None,
        model_name: str | None,
    ) -> InvocationResult:
        attrs, name, version, method = self._target(custom_attributes, model_name)
        handlers = self.handlers_for(name)
        if handlers is not None:
            if self.api.manager.has_model(name):  # the handler reaches it over HTTP, if at all
                note_model(name)
            return self._with_handlers(handlers, body, content_type, accept, attrs, name, version, method)
        with tracing.span("decode", {"tfservo.content_type": content_type or "", "tfservo.method": method}, leaf=True):
            prepared = self._prepare(body, content_type, accept, name, version, method)
        return prepared.result(self.api.run_held(prepared.handle, prepared.call))

    def _with_handlers(
        self,
        handlers: Handlers,
        body: bytes,
        content_type: str | None,
        accept: str | None,
        attrs: CustomAttributes,
        name: str,
        version: int | None,
        method: str,
    ) -> InvocationResult:
        context = Context(
            model_name=name,
            model_version=str(version) if version is not None else None,
            method=method,
            rest_uri=self.rest_uri(name, version, method),
            grpc_port=self._grpc_port(),
            grpc_uri=self.grpc_uri(),
            channel=self.grpc_channel(),
            custom_attributes=attrs.raw,
            request_content_type=content_type or JSON,
            accept_header=accept or JSON,
            content_length=len(body),
        )
        out, out_type, out_attributes = handlers.call(io.BytesIO(body), context, self._tfs_call)
        return InvocationResult(200, out, out_type or JSON, custom_attributes=out_attributes)

    def _tfs_call(self, request_body: bytes | str | dict[str, Any], context: Context) -> requests.Response:
        """In-process TF Serving REST call for input_handler/output_handler flows (a dict: arrays)."""
        version = int(context.model_version) if context.model_version else None
        data = request_body.encode() if isinstance(request_body, str) else request_body
        try:
            assert context.method is not None and context.model_name is not None  # Invoker set both
            status, body = 200, self.api.rest(context.method, context.model_name, version, self._label(version), data)
        except ServingError as exc:
            res = error_result(exc)
            status, body = res.status, res.body
        return make_requests_response(status, body, JSON, context.rest_uri)

    def _label(self, version: int | None) -> str | None:
        """The version label a call runs under: the variant's, when the call names no version."""
        return self.label if version is None else None

    def rest_uri(self, name: str, version: int | None, method: str) -> str:
        """The live TF Serving REST URL a handler can POST to."""
        base = self._rest_base() if self._rest_base else "http://127.0.0.1:8501"
        label = self._label(version)
        path = f"/v1/models/{name}" + (f"/versions/{version}" if version is not None else
                                       f"/labels/{label}" if label is not None else "")
        return f"{base}{path}:{method}"

    def grpc_uri(self) -> str | None:
        """`host:port` of this server's gRPC API (on the REST host, which reaches this server), or
        `unix:PATH` of a locked loopback server's."""
        socket = self._grpc_socket()
        if socket:
            return f"unix:{socket}"
        port = self._grpc_port()
        if not port:
            return None
        host = (urlsplit(self._rest_base()).hostname if self._rest_base else None) or "127.0.0.1"
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def grpc_channel(self) -> grpc.Channel | None:
        """A grpc channel to this server, made on first use and shared (it connects lazily too)."""
        uri = self.grpc_uri()
        if uri is None:
            return None
        with self._channel_lock:
            if self._channel is None or self._channel[0] != uri:
                import grpc

                # No 4 MB cap on answers: a handler may fetch outputs as large as REST would send.
                options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
                self._channel = (uri, tracing.traced_channel(grpc.insecure_channel(uri, options=options)))
            return self._channel[1]


class ComposedInvoker(Invoker):
    """An invoker over other bundles' invokers (a pipeline's containers, an endpoint's variants):
    each call decides where it goes, so doors run it whole, never queue a decoded call of it."""

    def __init__(self, inner: Invoker) -> None:
        super().__init__(inner.api, default_model=inner._default_model)

    def has_handlers(self) -> bool:
        return True

    def prepare(self, body: bytes, content_type: str | None, accept: str | None = None,
                custom_attributes: str | None = None, model_name: str | None = None) -> PreparedInvocation | None:
        return None

    def call_many(self, bodies: Sequence[bytes], content_type: str | None, accept: str | None = None,
                  custom_attributes: str | None = None, model_name: str | None = None) -> list[InvocationResult]:
        return [self.call(body, content_type, accept, custom_attributes, model_name) for body in bodies]
