"""TF Serving's gRPC API: PredictionService and ModelService over TFServingAPI.

The servicers subclass the `tensorflow_serving.apis` *_pb2_grpc classes, so TF Serving's own
client stubs work unchanged. Every call goes through TFServingAPI's array-level methods: the
same model manager, runtime and batcher as REST. A ServingError aborts the call with the
gRPC status of the same name (NOT_FOUND, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, …).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from tfservo.codecs.results import classification_result_proto, regression_result_proto
from tfservo.codecs.tensor_proto import MAX_FILL_BYTES, to_ndarray, write_tensor_proto
from tfservo.core import deadlines, tracing
from tfservo.core.errors import Code, InvalidArgument, ServingError, Unimplemented
from tfservo.core.request_labels import RequestScope, plain_scope
from tfservo.core.status import http_status
from tfservo.grpc.methods import Method, SyncContext, UndecodableRequest
from tfservo.models.calls import Answer, Classification, ExamplesCall, Prediction, Regression
from tfservo.models.servables import ServableVersion
from tfservo.models.signatures import CLASSIFY_METHOD, DEFAULT_SIGNATURE, REGRESS_METHOD
from tfservo.service.api import TFServingAPI
from tfservo.service.call_placement import CallPlacement
from tfservo.service.queued_calls import Prepared, QueuedCalls
from tfservo.service.warmup import serialized_examples  # Input → tf.Examples, shared with warmup replay

__all__ = [
    "MODEL_SERVICE",
    "PREDICTION_SERVICE",
    "SIGNATURE_DEF_FIELD",
    "grpc_status",
    "GrpcCalls",
    "MODEL_METHODS",
    "PREDICTION_METHODS",
    "ModelServicer",
    "PredictionServicer",
    "ReloadConfig",
]

log = logging.getLogger("tfservo.grpc")

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"
SIGNATURE_DEF_FIELD = "signature_def"

PREDICTION_METHODS = (
    Method("Predict", predict_pb2.PredictRequest, predict_pb2.PredictResponse, "invoke", inference=True),
    Method("Classify", classification_pb2.ClassificationRequest, classification_pb2.ClassificationResponse, "invoke",
           inference=True),
    Method("Regress", regression_pb2.RegressionRequest, regression_pb2.RegressionResponse, "invoke", inference=True),
    Method("MultiInference", inference_pb2.MultiInferenceRequest, inference_pb2.MultiInferenceResponse, "invoke",
           inference=True),
    Method("GetModelMetadata", get_model_metadata_pb2.GetModelMetadataRequest,
           get_model_metadata_pb2.GetModelMetadataResponse),
)
MODEL_METHODS = (
    Method("GetModelStatus", get_model_status_pb2.GetModelStatusRequest, get_model_status_pb2.GetModelStatusResponse),
    Method("HandleReloadConfigRequest", model_management_pb2.ReloadConfigRequest,
           model_management_pb2.ReloadConfigResponse, "manage"),
)

# Applies a ModelServerConfig (HandleReloadConfigRequest); None while no one can reload models.
ReloadConfig = Callable[[object], None]
_ExamplesResponse = TypeVar(
    "_ExamplesResponse", classification_pb2.ClassificationResponse, regression_pb2.RegressionResponse
)


def _selection(spec: model_pb2.ModelSpec) -> tuple[str, int | None, str | None]:
    """(name, version, label) a ModelSpec asks for."""
    if not spec.name:
        raise InvalidArgument("model_spec.name is empty; set it to the name of a served model")
    choice = spec.WhichOneof("version_choice")
    if choice == "version":
        return spec.name, spec.version.value, None
    if choice == "version_label":
        return spec.name, None, spec.version_label
    return spec.name, None, None


def _answer_spec(
    out: model_pb2.ModelSpec, answered: ServableVersion | Answer, signature_name: str | None
) -> None:
    out.name = answered.model_name
    out.version.value = answered.version
    if signature_name is not None:
        out.signature_name = signature_name


def grpc_status(code: Code | int) -> grpc.StatusCode:
    """The gRPC status of a canonical code (the same numbering and names)."""
    try:
        return grpc.StatusCode[Code(code).name]
    except (ValueError, KeyError):
        return grpc.StatusCode.UNKNOWN


_DEADLINE_SLACK = 0.05  # seconds: a call cancelled this close to its deadline was cancelled by it


class GrpcCalls:
    """Runs one RPC inside a request scope and turns ServingErrors into gRPC statuses: `run` in
    a thread (a SyncContext), `run_async` on the loop."""

    def __init__(self, service: str, scope: RequestScope) -> None:
        self._service = service
        self._scope = scope

    def _span(self, rpc: str, context: SyncContext | grpc.aio.ServicerContext) -> AbstractContextManager[Any]:
        """The call's SERVER span, continuing the caller's trace from its metadata (the HTTP
        door's `server_span`: a call not sampled makes nothing but the decision)."""
        if not tracing.enabled():
            return nullcontext()
        carrier = {key: value for key, value in context.invocation_metadata() or ()
                   if key in ("traceparent", "tracestate") and isinstance(value, str)}
        return tracing.server_span(f"/{self._service}/{rpc}", carrier, lambda: {
            "rpc.system": "grpc", "rpc.service": self._service, "rpc.method": rpc})

    @staticmethod
    def _ended(span: Any, status: grpc.StatusCode) -> None:
        if span is not None and span.sampled:
            span.set_attribute("rpc.grpc.status_code", status.value[0])
            if http_status(status.value[0]) >= 500:  # the server's failure, as the HTTP door marks its spans
                span.set_status(tracing.error_status(status.name))

    def run(self, rpc: str, method: str, context: SyncContext, fn: Callable[[], object], request: object = None) -> object:
        with self._span(rpc, context) as span, self._scope(f"/{self._service}/{rpc}", method) as labels, \
                deadlines.within(context.time_remaining()):
            try:
                self._check(rpc, context, request)
                response = fn()
            except Exception as exc:
                code, message = self._failure(rpc, exc)
                labels.status = code.name
                self._ended(span, code)
            else:
                labels.status = grpc.StatusCode.OK.name
                self._ended(span, grpc.StatusCode.OK)
                return response
        context.abort(code, message)  # after the scope: counted and logged before the client hears
        raise AssertionError("unreachable: abort raises")

    async def run_async(
        self, rpc: str, method: str, context: grpc.aio.ServicerContext, work: Callable[[], Awaitable[object]],
        request: object = None,
    ) -> object:
        with self._span(rpc, context) as span, self._scope(f"/{self._service}/{rpc}", method) as labels, \
                deadlines.within(context.time_remaining()):
            try:
                self._check(rpc, context, request)
                response = await work()
            except asyncio.CancelledError:  # grpc.aio ended the call: its deadline passed, or the client left
                remaining = context.time_remaining()
                passed = remaining is not None and remaining <= _DEADLINE_SLACK
                ended = grpc.StatusCode.DEADLINE_EXCEEDED if passed else grpc.StatusCode.CANCELLED
                labels.status = ended.name
                self._ended(span, ended)
                raise
            except Exception as exc:
                code, message = self._failure(rpc, exc)
                labels.status = code.name
                self._ended(span, code)
            else:
                labels.status = grpc.StatusCode.OK.name
                self._ended(span, grpc.StatusCode.OK)
                return response
        # After the scope: grpc.aio's abort sends the status before it raises, so a client could
        # otherwise read /metrics before this call was counted.
        await context.abort(code, message)
        raise AssertionError("unreachable: abort raises")

    @staticmethod
    def _check(rpc: str, context: SyncContext | grpc.aio.ServicerContext, request: object) -> None:
        if isinstance(request, UndecodableRequest):
            raise InvalidArgument(request.message)
        if context.cancelled():  # the client gave up (deadline, cancel) while this waited
            raise deadlines.DeadlineExceeded(f"{rpc}: the client gave up (deadline or cancel) before the call started")

    def _failure(self, rpc: str, exc: Exception) -> tuple[grpc.StatusCode, str]:
        """The status and message a call that raised `exc` ends with."""
        if isinstance(exc, ServingError):
            return grpc_status(exc.code), exc.message
        log.exception("%s/%s failed", self._service, rpc, exc_info=exc)  # a bug: INTERNAL, not a hang
        return grpc.StatusCode.INTERNAL, f"Internal error: {type(exc).__name__}: {exc}"


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):  # type: ignore[misc, unused-ignore]  # untyped generated stubs
    """tensorflow.serving.PredictionService: Predict, Classify, Regress, MultiInference, GetModelMetadata."""

    def __init__(
        self,
        api: TFServingAPI,
        placement: CallPlacement,
        queue: QueuedCalls,
        scope: RequestScope = plain_scope,
        max_fill_bytes: int = MAX_FILL_BYTES,
    ) -> None:
        self.api = api
        self.placement = placement  # where a predict runs when it is not queued for its batch
        self.queue = queue  # this door's batched predicts, queued from the loop
        self.max_fill_bytes = max_fill_bytes  # what one value filling a shape may expand to
        self._calls = GrpcCalls(PREDICTION_SERVICE, scope)

    async def Predict(self, request: predict_pb2.PredictRequest, context: grpc.aio.ServicerContext) -> object:
        return await self._calls.run_async("Predict", "predict", context, lambda: self.predict(request), request)

    def Classify(self, request: classification_pb2.ClassificationRequest, context: SyncContext) -> object:
        return self._calls.run("Classify", "classify", context, lambda: self.classify(request), request)

    def Regress(self, request: regression_pb2.RegressionRequest, context: SyncContext) -> object:
        return self._calls.run("Regress", "regress", context, lambda: self.regress(request), request)

    def MultiInference(self, request: inference_pb2.MultiInferenceRequest, context: SyncContext) -> object:
        return self._calls.run("MultiInference", "multi_inference", context, lambda: self.multi_inference(request), request)

    def GetModelMetadata(
        self, request: get_model_metadata_pb2.GetModelMetadataRequest, context: SyncContext
    ) -> object:
        return self._calls.run("GetModelMetadata", "metadata", context, lambda: self.metadata(request), request)

    # -- the calls, without gRPC -----------------------------------------------------------------

    async def predict(self, request: predict_pb2.PredictRequest) -> predict_pb2.PredictResponse:
        """A small predict, batched: decoded on the loop and queued; else in a thread (or inline,
        when quick and not batched), as HTTP's :predict."""
        name = request.model_spec.name
        return await self.queue.run(
            self.placement, (name, "predict"), name, request.ByteSize(), lambda: self.prepare_predict(request)
        )

    def prepare_predict(self, request: predict_pb2.PredictRequest) -> Prepared[predict_pb2.PredictResponse]:
        """The request's tensors as a predict on the version it names (held), and how its answer
        becomes a PredictResponse."""
        name, version, label = _selection(request.model_spec)
        signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        inputs = {key: to_ndarray(proto, f"input '{key}'", self.max_fill_bytes) for key, proto in request.inputs.items()}
        output_keys = list(request.output_filter) or None
        if output_keys is not None and len(set(output_keys)) != len(output_keys):
            dupes = sorted({k for k in output_keys if output_keys.count(k) > 1})
            raise InvalidArgument(f"duplicate output tensor alias in output_filter: {', '.join(dupes)}")
        handle, call = self.api.prepare_predict(name, version, label, signature_name, inputs, output_keys)

        def finish(answer: Answer) -> predict_pb2.PredictResponse:
            assert isinstance(answer, Prediction)
            response = predict_pb2.PredictResponse()
            _answer_spec(response.model_spec, answer, signature_name)
            for key, value in answer.outputs.items():
                write_tensor_proto(value, response.outputs[key], f"output '{key}'")
            return response

        return handle, call, finish

    def classify(self, request: classification_pb2.ClassificationRequest) -> classification_pb2.ClassificationResponse:
        response = classification_pb2.ClassificationResponse()
        return self._on_examples(request, self.api.classify, classification_result_proto, response)

    def regress(self, request: regression_pb2.RegressionRequest) -> regression_pb2.RegressionResponse:
        response = regression_pb2.RegressionResponse()
        return self._on_examples(request, self.api.regress, regression_result_proto, response)

    def _on_examples(
        self,
        request: Any,
        call: Callable[[str, int | None, str | None, str, list[bytes]], Classification | Regression],
        result_proto: Callable[[Any], Any],
        response: _ExamplesResponse,
    ) -> _ExamplesResponse:
        """Classify or Regress: run `call` (the API's classify/regress) on the request's examples
        and fill `response` with the version that answered and the results as `result_proto`."""
        name, version, label = _selection(request.model_spec)
        signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        answer = call(name, version, label, signature_name, serialized_examples(request.input))
        _answer_spec(response.model_spec, answer, signature_name)
        response.result.CopyFrom(result_proto(answer.results))
        return response

    def multi_inference(self, request: inference_pb2.MultiInferenceRequest) -> inference_pb2.MultiInferenceResponse:
        """Several classify/regress signatures of one model version on the same examples."""
        if not request.tasks:
            raise InvalidArgument("MultiInferenceRequest has no tasks; add at least one InferenceTask")
        name, version, label = _selection(request.tasks[0].model_spec)
        seen: set[str] = set()
        for task in request.tasks:
            if task.model_spec.name != name:
                raise InvalidArgument(
                    "All ModelSpecs in a MultiInferenceRequest must access the same model name "
                    f"(got {name} and {task.model_spec.name})"
                )
            signature_name = task.model_spec.signature_name or DEFAULT_SIGNATURE
            if signature_name in seen:
                raise InvalidArgument(f"Duplicate evaluation of signature: {signature_name}")
            seen.add(signature_name)
            if task.method_name not in (CLASSIFY_METHOD, REGRESS_METHOD):
                raise InvalidArgument(
                    f"Unsupported signature method_name: {task.method_name!r}; "
                    f"use {CLASSIFY_METHOD} or {REGRESS_METHOD}"
                )
        examples = serialized_examples(request.input)
        response = inference_pb2.MultiInferenceResponse()
        # Every task runs on the one version the handle holds, even if a newer one arrives meanwhile.
        with self.api.manager.acquire(name, version, label) as sv:
            for task in request.tasks:
                signature_name = task.model_spec.signature_name or DEFAULT_SIGNATURE
                result = response.results.add()
                method = "classify" if task.method_name == CLASSIFY_METHOD else "regress"
                answer = self.api.run(sv, ExamplesCall(method, signature_name, examples))
                if isinstance(answer, Classification):
                    result.classification_result.CopyFrom(classification_result_proto(answer.results))
                else:
                    assert isinstance(answer, Regression)
                    result.regression_result.CopyFrom(regression_result_proto(answer.results))
                _answer_spec(result.model_spec, answer, signature_name)
        return response

    def metadata(self, request: get_model_metadata_pb2.GetModelMetadataRequest) -> get_model_metadata_pb2.GetModelMetadataResponse:
        name, version, label = _selection(request.model_spec)
        if not request.metadata_field:
            raise InvalidArgument(
                f"GetModelMetadataRequest must specify at least one metadata_field; use '{SIGNATURE_DEF_FIELD}'"
            )
        for field in request.metadata_field:
            if field != SIGNATURE_DEF_FIELD:
                raise InvalidArgument(f"Metadata field {field} is not supported; use '{SIGNATURE_DEF_FIELD}'")
        sv, sig_map = self.api.signature_defs(name, version, label)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        _answer_spec(response.model_spec, sv, None)
        response.metadata[SIGNATURE_DEF_FIELD].Pack(sig_map)
        return response


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):  # type: ignore[misc, unused-ignore]  # untyped generated stubs
    """tensorflow.serving.ModelService: GetModelStatus and HandleReloadConfigRequest."""

    def __init__(
        self,
        api: TFServingAPI,
        scope: RequestScope = plain_scope,
        reload_config: Callable[[], ReloadConfig | None] = lambda: None,
    ) -> None:
        self.api = api
        self._calls = GrpcCalls(MODEL_SERVICE, scope)
        self._reload_config = reload_config

    def GetModelStatus(self, request: get_model_status_pb2.GetModelStatusRequest, context: SyncContext) -> object:
        return self._calls.run("GetModelStatus", "status", context, lambda: self.status(request), request)

    def HandleReloadConfigRequest(
        self, request: model_management_pb2.ReloadConfigRequest, context: SyncContext
    ) -> object:
        return self._calls.run("HandleReloadConfigRequest", "reload_config", context, lambda: self.reload(request), request)

    def status(self, request: get_model_status_pb2.GetModelStatusRequest) -> get_model_status_pb2.GetModelStatusResponse:
        name, version, label = _selection(request.model_spec)
        # The REST status document is the JSON form of GetModelStatusResponse: one source for both.
        doc = self.api.status(name, version, label)
        return json_format.ParseDict(doc, get_model_status_pb2.GetModelStatusResponse())

    def reload(self, request: model_management_pb2.ReloadConfigRequest) -> model_management_pb2.ReloadConfigResponse:
        reload_config = self._reload_config()
        if reload_config is None:
            raise Unimplemented(
                "HandleReloadConfigRequest is not available: this server was not started with a "
                "model config it can reload (start it with --model-config-file)"
            )
        reload_config(request.config)
        response = model_management_pb2.ReloadConfigResponse()
        response.status.error_code = 0  # OK
        return response
