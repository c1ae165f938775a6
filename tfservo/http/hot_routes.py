"""The inference routes as plain ASGI: TF Serving's POST :predict/:classify/:regress,
SageMaker's POST /invocations and /models/{name}/invoke, and its runtime API's POST
/endpoints/{name}/invocations (what boto3, the AWS CLI and the SDK call).

These carry nearly all traffic, and Starlette's request objects, routing and exception
middleware were ~20 % of a small request's CPU (docs/performance.md), so `ServingApp` sends
them here directly (routes.HotDispatch, from the route table); every other request (GETs,
unknown paths, wrong methods) goes to Starlette.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import anyio
import orjson
from starlette.types import Receive, Scope, Send

from tfservo.async_inference.intake import AsyncCall, AsyncIntake
from tfservo.codecs.media_types import JSON
from tfservo.core import deadlines
from tfservo.core.errors import InvalidArgument, NotFound, Overloaded, PayloadTooLarge, ServingError
from tfservo.http.content_encoding import decoded
from tfservo.http.request_context import context_of, lone_request, peer_of
from tfservo.http.runtime_api import (
    RuntimeError_,
    RuntimeRequest,
    RuntimeValidationError,
    check_request,
    model_error,
    runtime_error,
)
from tfservo.models.calls import Answer, parse_version
from tfservo.service.call_placement import CallPlacement
from tfservo.service.custom_attributes import CustomAttributes, parse_custom_attributes, requested_model
from tfservo.service.invocation import InvocationResult, error_result
from tfservo.service.queued_calls import Prepared, QueuedCalls
from tfservo.service.v2_dataplane import parse_v2_version
from tfservo.service.variants import VariantInvoker

if TYPE_CHECKING:
    from tfservo.auth.access import Access
    from tfservo.service.runtime import Runtime

__all__ = [
    "CUSTOM_ATTRIBUTES",
    "ClientDisconnected",
    "HotRoutes",
    "read_body",
    "request_header",
    "send_response",
    "send_result",
]

log = logging.getLogger("tfservo.http")

T = TypeVar("T")

CUSTOM_ATTRIBUTES = b"x-amzn-sagemaker-custom-attributes"
TARGET_MODEL = b"x-amzn-sagemaker-target-model"
TARGET_CONTAINER = b"x-amzn-sagemaker-target-container-hostname"  # a Direct pipeline's container
INVOKED_VARIANT = b"x-amzn-invoked-production-variant"
# InvokeEndpointAsync's headers, by the AsyncCall field each fills
_ASYNC_HEADERS = {
    "inference_id": b"x-amzn-sagemaker-inference-id",
    "input_location": b"x-amzn-sagemaker-inputlocation",
    "content_type": b"x-amzn-sagemaker-content-type",
    "accept": b"x-amzn-sagemaker-accept",
    "custom_attributes": CUSTOM_ATTRIBUTES,
    "ttl_seconds": b"x-amzn-sagemaker-requestttlseconds",
    "timeout_seconds": b"x-amzn-sagemaker-invocationtimeoutseconds",
    "output_extension": b"x-amzn-sagemaker-s3outputpathextension",
    "filename": b"x-amzn-sagemaker-filename",
}


class ClientDisconnected(Exception):
    """The client went away before its request body arrived; there is no one to answer."""


async def read_body(scope: Scope, receive: Receive, limit_bytes: int) -> bytes:
    """The request body, refusing (413) anything over the limit before reading it all, with its
    Content-Encoding undone (content_encoding: gzip, deflate; else 415)."""
    declared = request_header(scope, b"content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidArgument(f"Content-Length {declared!r} is not a number")
        if int(declared) > limit_bytes:
            raise PayloadTooLarge(_too_large(int(declared), limit_bytes))
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit_bytes:
                raise PayloadTooLarge(_too_large(size, limit_bytes))
            chunks.append(chunk)
        if not message.get("more_body", False):
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            encoding = request_header(scope, b"content-encoding")
            return body if encoding is None else decoded(body, encoding, limit_bytes)


def _too_large(size: int, limit: int) -> str:
    return (
        f"Request body of {size} bytes is over the limit of {limit} bytes "
        f"({limit / 2**20:g} MB); send less or start the server with a larger --max-request-mb"
    )


async def send_response(
    send: Send, status: int, body: bytes, content_type: str, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    """One complete HTTP response (text types get `charset=utf-8`, as Starlette adds it)."""
    if content_type.startswith("text/") and "charset=" not in content_type:
        content_type += "; charset=utf-8"
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", content_type.encode("latin-1")), (b"content-length", str(len(body)).encode()), *headers,
        ],
    })
    await send({"type": "http.response.body", "body": body})


async def send_result(
    send: Send, result: InvocationResult, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    if result.variant is not None:  # an endpoint of variants: the one that answered
        headers = (*headers, (INVOKED_VARIANT, result.variant.encode("latin-1")))
    if result.custom_attributes is not None:  # a handler's, passed on as SageMaker does
        headers = (*headers, (CUSTOM_ATTRIBUTES, result.custom_attributes.encode("latin-1")))
    if result.error is not None and result.error.retry_after is not None:
        headers = (*headers, retry_after_header(result.error.retry_after))
    await send_response(send, result.status, result.body, result.content_type, headers)


def retry_after_header(seconds: float) -> tuple[bytes, bytes]:
    """Retry-After in whole seconds (HTTP's form), at least 1."""
    return b"retry-after", str(max(1, math.ceil(seconds))).encode()


def request_header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (latin-1), or None; `name` in lower case."""
    for key, value in scope["headers"]:
        if key == name:  # ASGI servers give header names in lower case
            return str(value.decode("latin-1"))
    return None


def invoked_model(scope: Scope, default_model: Callable[[], str | None]) -> str | None:
    """The model an invocation names (tfs-model-name, or X-Amzn-SageMaker-Target-Model), else
    the default model: what a key limited to some models is checked against."""
    target = request_header(scope, TARGET_MODEL)
    if target is not None:
        return target
    try:
        attrs = parse_custom_attributes(request_header(scope, CUSTOM_ATTRIBUTES))
    except ServingError:
        attrs = CustomAttributes()  # the route answers the malformed header itself
    return requested_model(None, attrs, default_model)


def check_runtime_caller(access: Access, scope: Scope, body: bytes, default_model: Callable[[], str | None]) -> None:
    """Who calls the runtime API, checked by the server's access check: its SigV4 signature or
    bearer key (Throttled, SignatureRefused, Unauthenticated or NotAllowed after its audit
    line; never the signature or the key)."""
    peer = peer_of(scope)
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
    raw_path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string", b"").decode("latin-1")
    context_of(scope).caller = access.check_runtime(
        peer, request_header(scope, b"authorization"), f"path={scope['path']}",
        lambda verifier: verifier.verify(scope["method"], raw_path.decode("latin-1"), query, headers, body),
        lambda: invoked_model(scope, default_model),
    )


class HotRoutes:
    """The inference routes of one service, each a plain ASGI callable."""

    def __init__(
        self, runtime: Runtime, *, calls: CallPlacement, invocations: CallPlacement,
        async_intake: AsyncIntake | None = None,
    ) -> None:
        service, settings = runtime.service, runtime.settings
        self.service = service
        self.budget = runtime.budget  # the server's, across its workers
        self.batched = service.batches  # the service batches calls: small predicts are queued from the loop
        self.max_request_bytes = settings.max_request_bytes
        self.calls = calls  # TF Serving REST calls
        # Invocations get threads of their own: their handlers may call back into the REST API.
        self.invocations = invocations
        multi_model = runtime.multi_model  # multi-model mode: /models/{name}/invoke needs a loaded model
        self.is_loaded: Callable[[str], bool] | None = multi_model.is_loaded if multi_model is not None else None
        self.targets = runtime.targets  # multi-model mode: X-Amzn-SageMaker-Target-Model loads on first use
        self.endpoint_name = settings.endpoint_name  # None: the runtime API answers for any endpoint name
        self.variant = settings.variant_name
        invoker = service.invoker  # an endpoint of variants: TargetVariant may name any of them
        self.variants = list(invoker.variants) if isinstance(invoker, VariantInvoker) else [self.variant]
        self.request_timeout = settings.request_timeout  # TF Serving REST calls (0: none)
        self.invocation_timeout = settings.invocation_timeout  # invocations, handlers included (0: none)
        self.on_timeout = runtime.metrics.timeout  # (route, model, limit): the metrics' count and log line
        self.v2 = runtime.v2  # the Open Inference Protocol's data plane, the server's one
        # --sigv4-credentials or --api-keys: the runtime API takes only signed or keyed requests
        self.runtime_access: Access | None = runtime.access if runtime.access.guards_runtime else None
        self.access, self.gate = runtime.access, runtime.gate  # Target-Model loads
        self.async_intake = async_intake  # --async-inference-config: InvokeEndpointAsync's queue
        self.queue = QueuedCalls(service.api, batched=self.batched)  # small batched predicts, queued from the loop

    async def tfs_method(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v1/models/{name}[/versions/{v}|/labels/{l}]:{predict|classify|regress}."""
        params = scope["path_params"]
        name, method, label = params["name"], params["method"], params.get("label")
        try:
            version = parse_version(params.get("version"))
        except ServingError as exc:
            await send_result(send, error_result(exc))
            return

        api = self.service.api

        def prepare(body: bytes) -> Prepared[bytes]:
            return (*api.prepare(method, name, version, label, body), api.write_rest)

        async def call(body: bytes) -> bytes:
            if method == "predict":  # classify/regress: their tf.Examples are built in a thread, never on the loop
                return await self.queue.run(
                    self.calls, (name, method), name, len(body), lambda: prepare(body), lone=lone_request(scope),
                )
            return await self.calls.run(
                (name, method), len(body), lambda: api.rest(method, name, version, label, body),
                may_inline=not self.batched, group=name,
            )

        async def answer(body: bytes) -> None:
            try:
                out = await self._limited(
                    self.request_timeout, f"/v1/models/{{name}}:{method}", name, lambda: call(body),
                    "--rest_api_timeout_in_ms / --request-timeout",
                )
            except ServingError as exc:
                await send_result(send, error_result(exc))
                return
            await send_response(send, 200, out, JSON)

        await self._with_body(scope, receive, send, answer)

    async def invoke(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /invocations, or /models/{name}/invoke: through the service's one Invoker."""
        name = (scope.get("path_params") or {}).get("name")
        if name is not None and self.is_loaded is not None and not self.is_loaded(name):
            await send_result(send, error_result(NotFound(f"Model {name} is not loaded yet.")))
            return
        target = request_header(scope, TARGET_MODEL) if name is None and self.targets is not None else None

        async def answer(body: bytes) -> None:
            try:
                result = await self._invoke(scope, body, name, target)
            except ServingError as exc:
                result = error_result(exc)
            await send_result(send, result)

        await self._with_body(scope, receive, send, answer)

    async def v2_infer(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v2/models/{name}[/versions/{v}]/infer: the Open Inference Protocol, JSON or with
        binary tensors, through the same TF Serving API (and batcher) as :predict."""
        from tfservo.codecs.v2_messages import HEADER_LENGTH, decode_infer_request, encode_infer_response

        params = scope["path_params"]
        name = params["name"]
        header_length = request_header(scope, HEADER_LENGTH.encode())

        def prepare(body: bytes) -> Prepared[tuple[bytes, int | None]]:
            read, write = self.v2.shared_io
            request, as_binary = decode_infer_request(body, header_length, name, parse_v2_version(params.get("version")),
                                                      read)
            binary_output = bool(request.parameters.get("binary_data_output"))

            def finish(answer: Answer) -> tuple[bytes, int | None]:
                return encode_infer_response(self.v2.response(request, answer), as_binary, binary_output,
                                             request.output_parameters, write)

            return (*self.v2.prepare(request), finish)

        async def call(body: bytes) -> tuple[bytes, int | None]:
            return await self.queue.run(
                self.calls, (name, "v2"), name, len(body), lambda: prepare(body), lone=lone_request(scope),
            )

        async def answer(body: bytes) -> None:
            try:
                out, json_length = await self._limited(
                    self.request_timeout, "/v2/models/{name}/infer", name, lambda: call(body), "--request-timeout",
                )
            except ServingError as exc:
                await send_result(send, error_result(exc))
                return
            if json_length is None:
                await send_response(send, 200, out, JSON)
            else:
                await send_response(send, 200, out, "application/octet-stream",
                                    ((HEADER_LENGTH.encode(), str(json_length).encode()),))

        await self._with_body(scope, receive, send, answer)

    async def runtime_invoke(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /endpoints/{EndpointName}/invocations: SageMaker's runtime API (boto3, the AWS
        CLI, the SDK). Errors come in the shapes botocore raises as ModelError/ValidationError."""
        endpoint = scope["path_params"]["EndpointName"]
        variant = ((INVOKED_VARIANT, self.variant.encode()),)

        def checked(body: bytes) -> RuntimeRequest:
            if self.runtime_access is not None:  # AWS authenticates before it looks at anything else
                check_runtime_caller(self.runtime_access, scope, body, self.service.default_model)
            request = check_request(
                endpoint,
                served_endpoint=self.endpoint_name,
                variants=self.variants,
                target_variant=request_header(scope, b"x-amzn-sagemaker-target-variant"),
                target_model=request_header(scope, TARGET_MODEL),
                inference_id=request_header(scope, b"x-amzn-sagemaker-inference-id"),
                custom_attributes=request_header(scope, CUSTOM_ATTRIBUTES),
            )
            if request.target_model is not None and self.targets is None:
                raise RuntimeValidationError(
                    f"Endpoint {endpoint} is not a multi-model endpoint: X-Amzn-SageMaker-Target-Model "
                    "needs tfservo serve --multi-model"
                )
            return request

        if self.runtime_access is None:  # unsigned: the request is checked before its body is read
            try:
                early: RuntimeRequest | None = checked(b"")
            except ServingError as exc:
                await self._send_runtime_error(send, runtime_error(exc))
                return
        else:
            early = None

        async def answer(body: bytes) -> None:
            try:
                request = early or checked(body)
                result = await self._invoke(scope, body, None, request.target_model, request.target_variant)
            except ServingError as exc:
                await self._send_runtime_error(send, runtime_error(exc))
                return
            if not result.ok:
                await self._send_runtime_error(send, model_error(result, endpoint))
                return
            await send_result(send, result, () if result.variant is not None else variant)

        await self._with_body(scope, receive, send, answer, runtime=True)

    async def runtime_invoke_async(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /endpoints/{EndpointName}/async-invocations: InvokeEndpointAsync. The request is
        stored durably, then answered 202 with where its answer and error will be."""
        endpoint = scope["path_params"]["EndpointName"]

        async def answer(body: bytes) -> None:
            try:
                if self.runtime_access is not None:
                    check_runtime_caller(self.runtime_access, scope, body, self.service.default_model)
                check_request(
                    endpoint, served_endpoint=self.endpoint_name, variants=self.variants, target_variant=None,
                    target_model=None, inference_id=request_header(scope, b"x-amzn-sagemaker-inference-id"),
                    custom_attributes=request_header(scope, CUSTOM_ATTRIBUTES),
                )
                intake = self.async_intake
                if intake is None:
                    raise RuntimeValidationError(
                        f"Endpoint {endpoint} is not an asynchronous endpoint: start tfservo serve with "
                        "--async-inference-config FILE"
                    )
                call = AsyncCall(**{field: request_header(scope, header) for field, header in _ASYNC_HEADERS.items()},
                                 body=body)
                stored = await anyio.to_thread.run_sync(lambda: intake.submit(call))
            except ServingError as exc:
                await self._send_runtime_error(send, runtime_error(exc))
                return
            await send_response(send, 202, orjson.dumps({"InferenceId": stored.id}), JSON, (
                (b"x-amzn-sagemaker-outputlocation", stored.output.encode()),
                (b"x-amzn-sagemaker-failurelocation", stored.failure.encode()),
            ))

        await self._with_body(scope, receive, send, answer, runtime=True)

    async def _invoke(self, scope: Scope, body: bytes, name: str | None, target: str | None,
                      target_variant: str | None = None) -> InvocationResult:
        """One invocation through the service's Invoker; a target model is loaded first if new."""
        result = await self._invoke_once(scope, body, name, target, target_variant)
        if result.variant is not None:  # for the capture tap: the variant's folder, the shadow's eventId
            context = context_of(scope)
            context.variant, context.capture_id = result.variant, result.capture_id
        return result

    async def _invoke_once(self, scope: Scope, body: bytes, name: str | None, target: str | None,
                           target_variant: str | None) -> InvocationResult:
        content_type = request_header(scope, b"content-type")
        accept = request_header(scope, b"accept")
        attributes = request_header(scope, CUSTOM_ATTRIBUTES)
        invoker = self.service.invoker
        if target is not None:
            assert self.targets is not None
            targets = self.targets
            name = targets.loaded_name(target)
            if name is None:  # a load: the archive's code will run
                self.access.check_load(self.gate, context_of(scope).caller, peer_of(scope),
                                       f"{scope['method']} {scope['path']}", target)
                name = await anyio.to_thread.run_sync(lambda: targets.resolve(target))

        kind, group = ("invoke", name, attributes), name or attributes  # the model, as the request names it

        container = request_header(scope, TARGET_CONTAINER)

        def whole() -> InvocationResult:
            return invoker.invoke(body, content_type, accept, attributes, name, target_variant=target_variant,
                                  target_container=container)

        def prepare() -> Prepared[InvocationResult]:
            prepared = invoker.prepare(body, content_type, accept, attributes, name)
            assert prepared is not None, "queued only when the bundle has no handlers"
            return prepared.handle, prepared.call, prepared.written

        async def queued() -> InvocationResult:
            try:
                return await self.queue.queued(self.invocations, kind, group, prepare, lone=lone_request(scope))
            except Overloaded:
                raise  # the door's own refusal, as on the thread path
            except ServingError as exc:  # the invocation's: a result, as Invoker.invoke answers it
                return error_result(exc)

        def call() -> Awaitable[InvocationResult]:
            if self.queue.queueable(len(body)) and not invoker.has_handlers() and container is None \
                    and target_variant is None:  # a decoded call queued for its batch: the variant drawn by weight
                return queued()
            # A handler may call back over HTTP, and a batched call waits for its batch: neither
            # may hold the loop.
            may_inline = not invoker.has_handlers() and not self.batched
            return self.invocations.run(kind, len(body), whole, may_inline=may_inline, group=group)

        return await self._limited(
            self.invocation_timeout, context_of(scope).route or "/invocations", name, call,
            "--invocation-timeout / SAGEMAKER_GUNICORN_TIMEOUT_SECONDS",
        )

    async def _limited(
        self, seconds: float, route: str, model: str | None, call: Callable[[], Awaitable[T]], setting: str
    ) -> T:
        """`call()` within `seconds` (0: no limit): past it DeadlineExceeded (504), counted and
        logged; the work carries the deadline, so rows still queued for a batch are dropped."""
        if not seconds:
            return await call()
        # The request's own task is cancelled at the limit (a task per request, as wait_for makes,
        # cost ~10 µs and a turn of the loop); `expired` tells that cancel from any other.
        task = asyncio.current_task()
        assert task is not None
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        timer = asyncio.get_running_loop().call_later(seconds, expire)
        try:
            with deadlines.within(seconds):
                return await call()
        except asyncio.CancelledError:
            if not expired:
                raise
            if sys.version_info >= (3, 11):
                task.uncancel()  # the cancel was ours, and is answered here
            model = model or self.service.default_model()  # an invocation that names none
            if self.on_timeout is not None:
                self.on_timeout(route, model, seconds)
            raise deadlines.DeadlineExceeded(
                f"{route} for model {model or '-'} took longer than its limit of {seconds:g} s ({setting}); "
                "the request was abandoned"
            ) from None
        finally:
            timer.cancel()

    async def _send_runtime_error(self, send: Send, error: RuntimeError_) -> None:
        headers: tuple[tuple[bytes, bytes], ...] = ((b"x-amzn-errortype", error.error_type.encode()),)
        if error.retry_after is not None:
            headers += (retry_after_header(error.retry_after),)
        await send_response(send, error.status, error.body, JSON, headers)

    async def _with_body(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        answer: Callable[[bytes], Awaitable[None]],
        *,
        runtime: bool = False,
    ) -> None:
        """Read the body within the decode budget and `answer` it; the budget is held until the
        answer is sent. Over the budget: 503 with Retry-After, before the body is read when
        its Content-Length is declared."""
        declared = request_header(scope, b"content-length")
        held = int(declared) if declared is not None and declared.isdigit() else 0
        if not self.budget.hold(held):
            await self._busy(send, runtime)
            return
        try:
            try:
                body = await read_body(scope, receive, self.max_request_bytes)
            except ServingError as exc:
                if runtime:
                    await self._send_runtime_error(send, runtime_error(RuntimeValidationError(exc.message)))
                else:
                    await send_result(send, error_result(exc))
                return
            except ClientDisconnected:
                return
            context_of(scope).body = body  # what data capture and the payload logger record
            if len(body) > held:  # a chunked body: held anew as read (one hold, one release)
                self.budget.release(held)
                held = 0
                if not self.budget.hold(len(body)):
                    await self._busy(send, runtime)
                    return
                held = len(body)
            await answer(body)
        finally:
            self.budget.release(held)

    async def _busy(self, send: Send, runtime: bool) -> None:
        message = (
            f"tfservo is decoding {self.budget.server_held / 2**20:.0f} MB of other requests, its bound "
            f"(--max-decoding-mb {self.budget.limit_bytes / 2**20:g}); retry in a moment or send to another instance"
        )
        key, error_type = (b"message", b"ServiceUnavailable") if runtime else (b"error", None)
        headers = (retry_after_header(1),) + (((b"x-amzn-errortype", error_type),) if error_type else ())
        await send_response(send, 503, orjson.dumps({key.decode(): message}), JSON, headers)
