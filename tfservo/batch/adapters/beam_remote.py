"""`RemoteBundleModelHandler`: RunInference against a running tfservo or TF Serving endpoint.

    RemoteBundleModelHandler("http://host:8080", model_name="half_plus_two")       # REST
    RemoteBundleModelHandler("grpc://host:9000", model_name="half_plus_two")       # gRPC
    RemoteBundleModelHandler("http://host:8080", content_type="text/csv")         # /invocations

Elements, results, keys and error reporting are those of BundleModelHandler (same
run_inference); only the calls go over the network. The signature is read from the model's
metadata when the worker starts, so element conversion and method choice match the local
handler. 429/503 (gRPC RESOURCE_EXHAUSTED/UNAVAILABLE) and refused connections are retried
with exponential back-off and jitter, honouring Retry-After; other errors are not retried.
Beam's own RemoteModelHandler is not the base class because it forbids overriding
run_inference, where the per-element error reporting lives.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import orjson

from tfservo.batch.adapters.beam import ServingModelHandler
from tfservo.batch.adapters.beam_metrics import count_retry
from tfservo.batch.worker.loaded import Selection
from tfservo.batch.worker.target import (
    INVOKE,
    LoadedTarget,
    Target,
    check_method,
    choose_method,
    merged_attributes,
)
from tfservo.codecs import tfs_json as json_codec
from tfservo.core.batch_split import is_transient
from tfservo.core.errors import Code, InvalidArgument, ServingError, Unavailable, error_from_response
from tfservo.core.retry import Backoff
from tfservo.models.signatures import DEFAULT_SIGNATURE, SignatureDef, signature_from_proto
from tfservo.service.custom_attributes import HEADER as CUSTOM_ATTRIBUTES_HEADER
from tfservo.service.custom_attributes import parse_custom_attributes, requested_model

log = logging.getLogger("tfservo.batch.adapters.beam_remote")

T = TypeVar("T")
_RETRIED = (Code.RESOURCE_EXHAUSTED, Code.UNAVAILABLE)
_GRPC_MAX_MESSAGE = 512 * 2**20


class RetryPolicy:
    """Back-off for an overloaded or restarting endpoint: RESOURCE_EXHAUSTED / UNAVAILABLE answers
    are retried (tfservo.core.retry.Backoff), honouring the endpoint's Retry-After."""

    def __init__(
        self, max_retries: int = 5, initial_backoff_secs: float = 0.5, max_backoff_secs: float = 30.0
    ) -> None:
        try:
            self.backoff = Backoff(max_retries, initial_backoff_secs, max_backoff_secs)
        except ValueError as exc:
            raise ValueError(f"RetryPolicy(max_retries, initial_backoff_secs, max_backoff_secs): {exc}") from None

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """fn(), retried while it raises RESOURCE_EXHAUSTED / UNAVAILABLE."""
        started = time.monotonic()

        def note(exc: BaseException, retry: int, wait: float) -> None:
            log.warning("%s: %s; retrying in %.2f s", what, getattr(exc, "message", exc), wait)
            count_retry()

        try:
            return self.backoff.call(fn, retriable=_overloaded, on_retry=note)
        except ServingError as exc:
            if exc.code not in _RETRIED:
                raise
            raise type(exc)(
                f"{exc.message} (gave up after {self.backoff.retries + 1} attempts in "
                f"{time.monotonic() - started:.1f} s: the endpoint is overloaded or down; "
                "scale it, lower the pipeline's parallelism or raise max_retries)",
                exc.code,
            ) from None


def _overloaded(exc: BaseException) -> bool:
    return isinstance(exc, ServingError) and exc.code in _RETRIED


class RemoteBundleModelHandler(ServingModelHandler):
    """RunInference through a tfservo / TF Serving endpoint (http(s)://… REST, grpc://host:port gRPC).

    Takes BundleModelHandler's options (model_name is required unless content_type= is given:
    TF Serving cannot list its models) plus timeout_secs and the retry policy. With
    content_type=, each element is POSTed to /invocations (tfservo or SageMaker-style servers).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        protocol: str | None = None,
        timeout_secs: float = 60.0,
        max_retries: int = 5,
        initial_backoff_secs: float = 0.5,
        max_backoff_secs: float = 30.0,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self._endpoint, self._protocol = _parse_endpoint(endpoint, protocol)
        named = requested_model(self._selection.model_name, parse_custom_attributes(self._selection.custom_attributes),
                                lambda: None)  # the endpoint's default is not known from here
        if self._selection.content_type is None and not named:
            raise ValueError(
                f"model_name= is required for {endpoint}: TF Serving's API has no way to list "
                "models (or pass content_type= to POST raw bodies to /invocations)"
            )
        if self._selection.content_type is not None and self._protocol == "grpc":
            raise ValueError(
                "content_type= sends raw bodies to /invocations, which only exists over HTTP; "
                "use an http:// endpoint"
            )
        self._timeout = timeout_secs
        self._retry = RetryPolicy(max_retries, initial_backoff_secs, max_backoff_secs)

    def load_model(self) -> object:
        """A client for the endpoint, with the model's signature read from its metadata."""
        cls = GrpcEndpoint if self._protocol == "grpc" else RestEndpoint
        return cls(self._endpoint, self._selection, timeout=self._timeout, retry=self._retry)

    def __repr__(self) -> str:
        model = self._selection.model_name
        return f"RemoteBundleModelHandler({self._protocol}: {self._endpoint!r}, model={model!r})"


def _parse_endpoint(endpoint: str, protocol: str | None) -> tuple[str, str]:
    if protocol not in (None, "rest", "grpc"):
        raise ValueError(f"protocol={protocol!r} is not 'rest' or 'grpc'")
    if endpoint.startswith(("http://", "https://")):
        if protocol == "grpc":
            raise ValueError(f"{endpoint} is an HTTP URL; for gRPC give host:port or grpc://host:port")
        return endpoint.rstrip("/"), "rest"
    target = endpoint.removeprefix("grpc://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r} is neither an http(s):// URL nor grpc://host:port")
    if protocol == "rest":
        return f"http://{target}", "rest"
    return target, "grpc"


class _Endpoint(LoadedTarget):
    """What the two clients share: the resolved target, load time and the retry policy."""

    def __init__(self, endpoint: str, selection: Selection, *, timeout: float, retry: RetryPolicy) -> None:
        t0 = time.perf_counter()
        self.endpoint = endpoint
        self.selection = selection
        self.timeout = timeout
        self.retry = retry
        self._attrs = parse_custom_attributes(selection.custom_attributes)
        self._connect()
        self._loaded(self._resolve(), t0)

    def _resolve(self) -> Target:
        s = self.selection
        name = requested_model(s.model_name, self._attrs, lambda: None)
        version = s.version if s.version is not None else self._attrs.version_number
        if s.content_type is not None:
            return Target(self.endpoint, INVOKE, name, version)
        assert name is not None
        seen_version, signatures = self.retry.call(
            f"metadata of {name}", lambda: self._metadata(name, version)
        )
        wanted = s.signature_name or DEFAULT_SIGNATURE
        if wanted not in signatures:
            raise InvalidArgument(
                f"Model {name} version {seen_version} at {self.endpoint} has no signature "
                f"'{wanted}'; its signatures: {', '.join(sorted(signatures)) or 'none'}. "
                "Pass signature_name= one of them"
            )
        signature = signatures[wanted]
        method = choose_method(s.method, self._attrs, signature)
        target = Target(self.endpoint, method, name, seen_version, signature)
        check_method(method, signature, target.describe())
        return target

    def _connect(self) -> None:
        raise NotImplementedError

    def _metadata(self, name: str, version: int | None) -> tuple[int, dict[str, SignatureDef]]:
        raise NotImplementedError


class RestEndpoint(_Endpoint):
    """TF Serving's REST API (and tfservo's /invocations) over httpx."""

    def _connect(self) -> None:
        import httpx

        self._httpx = httpx
        self._client = httpx.Client(base_url=self.endpoint, timeout=self.timeout)

    def _model_path(self, name: str, version: int | None) -> str:
        return f"/v1/models/{name}" + (f"/versions/{version}" if version is not None else "")

    def _send(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> bytes:
        """One HTTP call; non-2xx → ServingError of its kind (429/503 carry Retry-After)."""
        what = f"{method} {self.endpoint}{path}"
        try:
            response = self._client.request(method, path, content=body, headers=headers)
        except self._httpx.TimeoutException as exc:
            raise ServingError(
                f"{what} timed out after {self.timeout} s ({type(exc).__name__}); raise timeout_secs "
                "or send smaller batches (max_batch_size=)",
                Code.DEADLINE_EXCEEDED,
            ) from None
        except self._httpx.TransportError as exc:
            raise Unavailable(f"{what} failed: {type(exc).__name__}: {exc}") from None
        if response.is_success:
            return response.content
        error = error_from_response(response.status_code, response.content, what)
        retry_after = response.headers.get("retry-after", "")
        if retry_after.replace(".", "", 1).isdigit():
            error.retry_after = float(retry_after)
        raise error

    def _metadata(self, name: str, version: int | None) -> tuple[int, dict[str, SignatureDef]]:
        doc = json_codec.parse_json(self._send("GET", self._model_path(name, version) + "/metadata"))
        try:
            seen = int(doc["model_spec"]["version"])
            defs = doc["metadata"]["signature_def"]["signature_def"]
        except (KeyError, TypeError, ValueError):
            raise InvalidArgument(
                f"{self.endpoint} answered metadata of model {name} without model_spec.version and "
                "metadata.signature_def; is it a TF Serving REST endpoint?"
            ) from None
        from google.protobuf import json_format
        from tensorflow.core.protobuf import meta_graph_pb2

        signatures = {}
        for key, value in defs.items():
            signatures[key] = signature_from_proto(key, json_format.ParseDict(value, meta_graph_pb2.SignatureDef()))
        return seen, signatures

    def _post(self, verb: str, body: bytes) -> object:
        t = self._target
        assert t.model_name is not None
        path = f"{self._model_path(t.model_name, self.selection.version)}:{verb}"
        return json_codec.parse_json(
            self.retry.call(f"{verb} {t.model_id}", lambda: self._send("POST", path, body, _JSON))
        )

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        t = self._target
        assert t.signature is not None
        doc = self._post("predict", _predict_body(t.signature.name, inputs))
        if not isinstance(doc, dict) or "outputs" not in doc:
            raise InvalidArgument(
                f"{self.endpoint} answered predict without 'outputs': {json_codec.render_value(doc)}"
            )
        # The answer's columnar "outputs" decode like columnar inputs of the signature's outputs.
        outputs_sig = SignatureDef(
            t.signature.name, t.signature.method_name, inputs=dict(t.signature.outputs)
        )
        return json_codec.decode_predict_request({"inputs": doc["outputs"]}, lambda _: outputs_sig).inputs

    def classify(self, examples: Sequence[bytes]) -> list[list[tuple[str, float]]]:
        results = self._results("classify", examples)
        return [[(str(label), float(score)) for label, score in classes] for classes in results]

    def regress(self, examples: Sequence[bytes]) -> list[float]:
        return [float(value) for value in self._results("regress", examples)]

    def _results(self, verb: str, examples: Sequence[bytes]) -> list[Any]:
        t = self._target
        assert t.signature is not None
        request = {"signature_name": t.signature.name, "examples": [_example_json(e) for e in examples]}
        doc = self._post(verb, orjson.dumps(request))
        if (
            not isinstance(doc, dict)
            or not isinstance(doc.get("results"), list)
            or len(doc["results"]) != len(examples)
        ):
            raise InvalidArgument(
                f"{self.endpoint} answered {verb} of {len(examples)} examples with "
                f'{json_codec.render_value(doc)}; expected {{"results": [...]}} with one result each'
            )
        results: list[Any] = doc["results"]
        return results

    def invoke(self, body: bytes) -> bytes:
        s = self.selection
        headers = {"Content-Type": s.content_type or "application/json"}
        if s.accept:
            headers["Accept"] = s.accept
        attrs = merged_attributes(s.custom_attributes, s.version, s.method)
        if s.model_name:
            attrs = ",".join(filter(None, [attrs, f"tfs-model-name={s.model_name}"]))
        if attrs:
            headers[CUSTOM_ATTRIBUTES_HEADER] = attrs
        return self.retry.call("/invocations", lambda: self._send("POST", "/invocations", body, headers))

    def invoke_many(self, bodies: Sequence[bytes]) -> list[bytes | Exception]:
        """One /invocations request per body (the endpoint's handlers decide how to answer each)."""
        out: list[bytes | Exception] = []
        for body in bodies:
            try:
                out.append(self.invoke(body))
            except Exception as exc:
                if is_transient(exc):
                    raise
                out.append(exc)
        return out


class GrpcEndpoint(_Endpoint):
    """TF Serving's gRPC PredictionService (tensorflow_serving stubs)."""

    def _connect(self) -> None:
        import grpc
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        self._grpc = grpc
        options = [
            ("grpc.max_send_message_length", _GRPC_MAX_MESSAGE),
            ("grpc.max_receive_message_length", _GRPC_MAX_MESSAGE),
        ]
        self._channel = grpc.insecure_channel(self.endpoint, options=options)
        self._stub = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)

    def _call(self, rpc: str, request: Any) -> Any:
        """One RPC; a failure becomes the ServingError of its status code."""
        try:
            return getattr(self._stub, rpc)(request, timeout=self.timeout)
        except self._grpc.RpcError as exc:
            code = Code(exc.code().value[0]) if exc.code() is not None else Code.UNKNOWN
            raise ServingError(
                f"{rpc} on {self.endpoint} failed: {code.name}: {exc.details()}", code
            ) from None

    def _spec(self, request: Any, signature: bool = True) -> None:
        t = self._target
        request.model_spec.name = t.model_name
        if self.selection.version is not None:
            request.model_spec.version.value = self.selection.version
        if signature and t.signature is not None:
            request.model_spec.signature_name = t.signature.name

    def _metadata(self, name: str, version: int | None) -> tuple[int, dict[str, SignatureDef]]:
        from tensorflow_serving.apis import get_model_metadata_pb2

        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = name
        if version is not None:
            request.model_spec.version.value = version
        response = self._call("GetModelMetadata", request)
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(sig_map)
        return response.model_spec.version.value, {
            k: signature_from_proto(k, v) for k, v in sig_map.signature_def.items()
        }

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from tensorflow_serving.apis import predict_pb2

        from tfservo.codecs.tensor_proto import to_ndarray, write_tensor_proto

        request = predict_pb2.PredictRequest()
        self._spec(request)
        for key, arr in inputs.items():
            write_tensor_proto(arr, request.inputs[key], f"input '{key}'")
        response = self.retry.call(f"Predict {self._target.model_id}", lambda: self._call("Predict", request))
        return {key: to_ndarray(proto, f"output '{key}'") for key, proto in response.outputs.items()}

    def classify(self, examples: Sequence[bytes]) -> list[list[tuple[str, float]]]:
        from tensorflow_serving.apis import classification_pb2

        request = classification_pb2.ClassificationRequest()
        self._spec(request)
        for serialized in examples:
            request.input.example_list.examples.add().ParseFromString(serialized)
        response = self.retry.call(
            f"Classify {self._target.model_id}", lambda: self._call("Classify", request)
        )
        return [[(c.label, c.score) for c in item.classes] for item in response.result.classifications]

    def regress(self, examples: Sequence[bytes]) -> list[float]:
        from tensorflow_serving.apis import regression_pb2

        request = regression_pb2.RegressionRequest()
        self._spec(request)
        for serialized in examples:
            request.input.example_list.examples.add().ParseFromString(serialized)
        response = self.retry.call(f"Regress {self._target.model_id}", lambda: self._call("Regress", request))
        return [r.value for r in response.result.regressions]

    def invoke(self, body: bytes) -> bytes:
        raise InvalidArgument("/invocations is HTTP only; use an http:// endpoint for content_type=")


_JSON = {"Content-Type": "application/json"}


def _predict_body(signature_name: str, inputs: Mapping[str, np.ndarray]) -> bytes:
    """A columnar TF Serving :predict request; bytes as {"b64": ...}; NaN/±Infinity kept."""
    values: dict[str, object] = {}
    nonfinite = False
    for key, arr in inputs.items():
        if arr.dtype == object or arr.dtype.kind in "SU":
            values[key] = (
                np.vectorize(_json_string, otypes=[object])(arr).tolist() if arr.size else arr.tolist()
            )
        else:
            nonfinite = nonfinite or (arr.dtype.kind == "f" and not bool(np.all(np.isfinite(arr))))
            values[key] = np.ascontiguousarray(arr)
    doc = {"signature_name": signature_name, "inputs": values}
    if nonfinite:  # orjson writes NaN as null; TF Serving reads NaN / Infinity tokens
        plain = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in values.items()}
        return json.dumps({"signature_name": signature_name, "inputs": plain}).encode()
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def _json_string(value: object) -> object:
    if isinstance(value, (bytes, bytearray, np.bytes_)):
        return {"b64": base64.b64encode(bytes(value)).decode("ascii")}
    return str(value)


def _example_json(serialized: bytes) -> dict[str, object]:
    """A serialized tf.train.Example as a TF Serving JSON example (bytes as {"b64": ...})."""
    from tensorflow.core.example import example_pb2

    example = example_pb2.Example()
    try:
        example.ParseFromString(serialized)
    except Exception as exc:
        raise InvalidArgument(f"element is not a serialized tf.train.Example ({exc})") from None
    out: dict[str, object] = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "float_list":
            out[name] = list(feature.float_list.value)
        elif kind == "int64_list":
            out[name] = list(feature.int64_list.value)
        elif kind == "bytes_list":
            out[name] = [{"b64": base64.b64encode(v).decode("ascii")} for v in feature.bytes_list.value]
        else:
            out[name] = []
    return out


__all__ = ["GrpcEndpoint", "RemoteBundleModelHandler", "RestEndpoint", "RetryPolicy"]
