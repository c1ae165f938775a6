"""A generated battery of client mistakes against real servers: TF Serving's REST API,
/invocations, multi-model /models, raw HTTP bytes and gRPC. Whatever arrives, the answer is
200 or a 4xx (gRPC: a status other than INTERNAL/UNKNOWN), every HTTP error body is JSON
saying what was wrong, and nothing hangs (each call has a timeout, which would fail it)."""

from __future__ import annotations

import json
import socket
import string
from urllib.parse import quote

import grpc
import httpx
import pytest
from conftest import SMC, TFS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_process import ServerProcess
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import predict_pb2

BATTERY = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
MODELS = ["saved_model_half_plus_two_2_versions", "saved_model_half_plus_three", "half_plus_three", "nope", ""]

# -- pieces of requests ---------------------------------------------------------------------

names = st.one_of(st.sampled_from(MODELS), st.text(max_size=40), st.text(string.printable, max_size=300))
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
    st.text(max_size=20), st.just({"b64": "AAAA"}), st.just({"b64": "not base64!"}),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=30)
documents = st.one_of(
    st.fixed_dictionaries({"instances": values}),
    st.fixed_dictionaries({"inputs": values}),
    st.fixed_dictionaries({"examples": values}, optional={"context": values}),
    st.fixed_dictionaries({"signature_name": st.one_of(st.text(max_size=20), values), "instances": values}),
    st.dictionaries(st.text(max_size=12), values, max_size=4),
    values,
)


def deep(depth: int, leaf: bytes = b"1") -> bytes:
    return b'{"instances": ' + b"[" * depth + leaf + b"]" * depth + b"}"


bodies = st.one_of(
    documents.map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=300),
    st.text(max_size=200).map(str.encode),
    st.sampled_from([
        deep(65), deep(250), deep(5000), b'{"instances": [1e999]}', b'{"instances": [NaN]}',
        b'{"instances": [1, 2', b"\xef\xbb\xbf{}", b'{"instances": "\x00"}', b"\x00" * 64,
        b'{"instances": [[1, 2], [3]]}', b'{"inputs": {"x": [[1.0]], "x": [2.0]}}',
        b'{"instances": [{"b64": 7}]}', b"1,2\n3\n", b'{"instances": [' + b"1," * 100_000 + b"1]}",
    ]),
)
content_types = st.one_of(
    st.sampled_from(["application/json", "text/csv", "application/jsonlines", "application/x-npy",
                     "application/json; charset=latin-1", "application/json; charset=nope", "image/jpeg"]),
    st.text(string.printable.strip(), max_size=40),
)
attributes = st.one_of(
    st.none(),
    st.builds(lambda n, v: f"tfs-model-name={n},tfs-model-version={v}", st.sampled_from(MODELS), st.text(string.ascii_letters + string.digits, max_size=8)),
    st.text(string.printable.strip(), max_size=80),
)
paths = st.builds(
    lambda name, selector, method: f"/v1/models/{name}{selector}:{method}",
    st.one_of(st.sampled_from(MODELS[:3]), st.text(string.ascii_letters + "%._-", min_size=1, max_size=30)),
    st.one_of(st.just(""), st.sampled_from(["/versions/123", "/versions/124", "/versions/-1", "/versions/99999999999999999999",
                                             "/labels/stable", "/labels/nope", "/versions/x"])),
    st.sampled_from(["predict", "classify", "regress", "nope", ""]),
)


def check_http(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/json"), response.text[:300]
        error = response.json()["error"]
        assert isinstance(error, str) and error, response.text[:300]


# -- TF Serving REST and /invocations, on the shared server -----------------------------------


@BATTERY
@given(path=paths, body=bodies)
def test_rest_predict_classify_regress(http, path, body) -> None:
    check_http(http.post(path, content=body, timeout=30))


@BATTERY
@given(body=bodies, content_type=content_types, accept=st.one_of(st.none(), content_types), custom=attributes)
def test_invocations(http, body, content_type, accept, custom) -> None:
    headers = {"Content-Type": content_type}
    if accept is not None:
        headers["Accept"] = accept
    if custom is not None:
        headers["X-Amzn-SageMaker-Custom-Attributes"] = custom
    check_http(http.post("/invocations", content=body, headers=headers, timeout=30))


@BATTERY
@given(method=st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "OPTIONS"]),
       path=st.one_of(paths, st.sampled_from(["/v1/models", "/v1/models/", "/ping", "/invocations", "/models",
                                              "/v1/models/half_plus_three/metadata", "/metrics"])))
def test_other_methods_and_paths(http, method, path) -> None:
    response = http.request(method, path, timeout=30)
    assert response.status_code < 500, response.text[:300]
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/json"), response.text[:300]


request_lines = st.builds(
    lambda method, target, version: f"{method} {target} {version}".encode(),
    st.sampled_from(["GET", "POST", "PUT", "BREW", "", "G\x00T"]),
    st.one_of(st.sampled_from(["/ping", "/invocations", "*", "http://x/ping", ""]), st.text(max_size=30)),
    st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.1 extra", ""]),
)
headers_raw = st.lists(st.one_of(
    st.sampled_from([b"Host: x", b"Content-Length: 5", b"Content-Length: -1", b"Content-Length: 99999999999999999999",
                     b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip", b"Connection: Upgrade",
                     b"Upgrade: websocket", b"Expect: 100-continue", b"Content-Type: application/json"]),
    st.binary(max_size=40),
), max_size=6)


@BATTERY
@given(line=request_lines, headers=headers_raw, body=st.binary(max_size=64))
def test_raw_http_bytes(tfs_server, line, headers, body) -> None:
    """Bytes a broken client might send: an answer is JSON with a status under 500, or none
    when the server cannot tell where a request starts; either way the connection closes."""
    host, port = tfs_server.url.removeprefix("http://").split(":")
    data = line + b"\r\n" + b"".join(h.replace(b"\r\n", b"") + b"\r\n" for h in headers) + b"\r\n" + body
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # nothing more is coming: the server must answer or close
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    for response in _responses(answer):
        status, head, payload = response
        assert status < 500, answer[:400]
        if status >= 400:
            assert b"content-type: application/json" in head.lower(), answer[:400]
            json.loads(payload)


def _responses(answer: bytes) -> list[tuple[int, bytes, bytes]]:
    """The HTTP/1.1 responses in `answer` (several when the bytes held several requests)."""
    out = []
    while answer.startswith(b"HTTP/1.1 "):
        head, _, rest = answer.partition(b"\r\n\r\n")
        length = next((int(v) for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
                       if k.strip().lower() == b"content-length"), 0)
        out.append((int(head.split(b" ", 2)[1]), head, rest[:length]))
        answer = rest[length:]
    return out


# -- gRPC ---------------------------------------------------------------------------------------

_CLIENT_MISTAKES = {
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
GRPC_METHODS = [
    "/tensorflow.serving.PredictionService/Predict", "/tensorflow.serving.PredictionService/Classify",
    "/tensorflow.serving.PredictionService/Regress", "/tensorflow.serving.PredictionService/MultiInference",
    "/tensorflow.serving.PredictionService/GetModelMetadata", "/tensorflow.serving.ModelService/GetModelStatus",
    "/tensorflow.serving.ModelService/HandleReloadConfigRequest", "/tensorflow.serving.PredictionService/Nope",
]


@pytest.fixture(scope="module")
def channel(tfs_server):
    with grpc.insecure_channel(tfs_server.grpc_target) as ch:
        yield ch


def grpc_status(channel, method: str, payload: bytes) -> grpc.StatusCode:
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        call(payload, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() is not grpc.StatusCode.DEADLINE_EXCEEDED, f"{method} hung"
        return exc.code()
    return grpc.StatusCode.OK


dims = st.lists(st.one_of(st.integers(-2, 4), st.integers(2**20, 2**62)), max_size=6)
tensors = st.builds(
    lambda dtype, shape, floats, ints, content: tensor_pb2.TensorProto(
        dtype=dtype, tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in shape]),
        float_val=floats, int_val=ints, tensor_content=content),
    st.sampled_from([types_pb2.DT_FLOAT, types_pb2.DT_INT32, types_pb2.DT_STRING, types_pb2.DT_HALF, types_pb2.DT_VARIANT, 999]),
    dims, st.lists(st.floats(width=32), max_size=6), st.lists(st.integers(-(2**31), 2**31 - 1), max_size=6),
    st.binary(max_size=24),
)


@BATTERY
@given(name=names, version=st.integers(-(2**63), 2**63 - 1), label=st.text(max_size=10),
       inputs=st.dictionaries(st.sampled_from(["x", "y", ""]), tensors, max_size=2),
       signature=st.sampled_from(["", "serving_default", "regress_x_to_y", "nope"]))
def test_grpc_predict_requests(channel, name, version, label, inputs, signature) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    if version >= 0:
        request.model_spec.version.value = version
    elif label:
        request.model_spec.version_label = label
    request.model_spec.signature_name = signature
    for key, tensor in inputs.items():
        request.inputs[key].CopyFrom(tensor)
    code = grpc_status(channel, "/tensorflow.serving.PredictionService/Predict", request.SerializeToString())
    assert code in _CLIENT_MISTAKES, code


@BATTERY
@given(method=st.sampled_from(GRPC_METHODS), payload=st.binary(max_size=200))
def test_grpc_bytes_that_are_not_the_request(channel, method, payload) -> None:
    assert grpc_status(channel, method, payload) in _CLIENT_MISTAKES


# -- multi-model /models ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mme(tmp_path_factory):
    root = tmp_path_factory.mktemp("battery-root")
    (root / "a_file.tar.gz").write_bytes(b"not an archive")
    with ServerProcess(["--model-root", str(root)], env={"SAGEMAKER_MULTI_MODEL": "true"}) as proc:
        with proc.client() as client:
            yield client, root


urls = st.one_of(
    st.text(max_size=60), st.text(string.printable, min_size=250, max_size=400),
    st.sampled_from(["a_file.tar.gz", "../", "/etc", "/", "file:///etc", "s3://b/k", "missing", "a\x00b",
                     str(TFS), str(SMC / "resources" / "mme" / "half_plus_two")]),
    st.integers(), st.none(), st.lists(st.text(max_size=5), max_size=3),
)


@BATTERY
@given(body=st.one_of(
    st.fixed_dictionaries({"model_name": st.one_of(names, st.integers(), st.none()), "url": urls}),
    st.dictionaries(st.text(max_size=12), urls, max_size=3),
    bodies,
))
def test_multi_model_loads(mme, body) -> None:
    client, _ = mme
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post("/models", content=content, timeout=30)
    check_http(response)
    assert response.status_code != 200, response.text  # nothing here is a loadable model in the root


@BATTERY
@given(method=st.sampled_from(["GET", "DELETE", "POST"]), name=st.text(string.printable, max_size=300),
       suffix=st.sampled_from(["", "/invoke", "/nope"]))
def test_multi_model_paths(mme, method, name, suffix) -> None:
    client, _ = mme
    response = client.request(method, "/models/" + quote(name, safe="") + suffix,
                              content=b'{"instances": [1.0]}', timeout=30)
    check_http(response)
