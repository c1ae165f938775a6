"""The Open Inference Protocol (KServe V2) over REST, with tritonclient (binary tensors by
default, JSON when asked) and plain JSON; answers equal TF Serving REST's for the same inputs,
errors in V2's shape, and V2 and TF Serving callers batched together never get each other's
rows."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import TFS
from server_process import ServerProcess

HALF_PLUS_TWO = "saved_model_half_plus_two_cpu"


@pytest.fixture(scope="module")
def mixed_model(tmp_path_factory):
    """a float32[-1,2], b int64[-1], s string[-1] → sum float32, doubled int64, upper string."""
    import tensorflow as tf

    class Mixed(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="a"),
                                      tf.TensorSpec([None], tf.int64, name="b"),
                                      tf.TensorSpec([None], tf.string, name="s")])
        def serve(self, a, b, s):
            return {"total": tf.reduce_sum(a, axis=1), "doubled": b * 2, "upper": tf.strings.upper(s)}

    root = tmp_path_factory.mktemp("mixed") / "mixed"
    module = Mixed()
    tf.saved_model.save(module, str(root / "1"), signatures={"serving_default": module.serve.get_concrete_function()})
    return root


@pytest.fixture(scope="module")
def server(mixed_model):
    server = ServerProcess([str(TFS / HALF_PLUS_TWO), str(mixed_model), "--enable-batching"],
                           env={"SAGEMAKER_TFS_MAX_BATCH_SIZE": "32", "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": "5000"}).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def triton(server):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"), concurrency=8)
    yield client
    client.close()


def test_server_and_model_metadata_and_readiness(triton):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready(HALF_PLUS_TWO) and triton.is_model_ready(HALF_PLUS_TWO, "123")
    assert "binary_tensor_data" in triton.get_server_metadata()["extensions"]
    meta = triton.get_model_metadata("mixed")
    assert meta["versions"] == ["1"]
    assert {(t["name"], t["datatype"], tuple(t["shape"])) for t in meta["inputs"]} == {
        ("a", "FP32", (-1, 2)), ("b", "INT64", (-1,)), ("s", "BYTES", (-1,))}
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="not served|not found|NOT_FOUND|Servable"):
        triton.get_model_metadata("nope")


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_infer_several_dtypes(triton, binary):
    import tritonclient.http as httpclient

    a = np.array([[1, 2], [3, 4]], np.float32)
    b = np.array([5, 6], np.int64)
    s = np.array([b"ab", b"cd"], dtype=object)
    inputs = []
    for name, value, datatype in (("a", a, "FP32"), ("b", b, "INT64"), ("s", s, "BYTES")):
        tensor = httpclient.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("total", "doubled", "upper")]
    result = triton.infer("mixed", inputs, outputs=outputs, request_id="req-7")
    assert result.get_response()["id"] == "req-7"
    np.testing.assert_array_equal(result.as_numpy("total"), [3.0, 7.0])
    np.testing.assert_array_equal(result.as_numpy("doubled"), [10, 12])
    assert [bytes(v) if not isinstance(v, str) else v.encode() for v in result.as_numpy("upper")] == [b"AB", b"CD"]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_request_compression(triton, algorithm, binary):
    """tritonclient's request_compression_algorithm: Content-Encoding undone before the binary
    header length (which counts the uncompressed JSON) is read."""
    import tritonclient.http as httpclient

    a = httpclient.InferInput("a", [2, 2], "FP32")
    a.set_data_from_numpy(np.array([[1, 2], [3, 4]], np.float32), binary_data=binary)
    b = httpclient.InferInput("b", [2], "INT64")
    b.set_data_from_numpy(np.array([5, 6], np.int64), binary_data=binary)
    s = httpclient.InferInput("s", [2], "BYTES")
    s.set_data_from_numpy(np.array([b"ab", b"cd"], dtype=object), binary_data=binary)
    result = triton.infer("mixed", [a, b, s], request_compression_algorithm=algorithm,
                          response_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("total"), [3.0, 7.0])
    np.testing.assert_array_equal(result.as_numpy("doubled"), [10, 12])


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False])
def test_answers_are_compressed_when_asked_and_large_enough(triton, server, algorithm, binary):
    """Accept-Encoding (tritonclient's response_compression_algorithm): an answer of 1,400 bytes
    or more comes compressed and reads back the same, binary tensors included; a small one and
    one nobody asked to compress come as they are."""
    import httpx
    import tritonclient.http as httpclient

    a = httpclient.InferInput("a", [600, 2], "FP32")
    values = np.arange(1200, dtype=np.float32).reshape(600, 2)
    a.set_data_from_numpy(values, binary_data=binary)
    b = httpclient.InferInput("b", [600], "INT64")
    b.set_data_from_numpy(np.arange(600, dtype=np.int64), binary_data=binary)
    s = httpclient.InferInput("s", [600], "BYTES")
    s.set_data_from_numpy(np.array([b"ab"] * 600, dtype=object), binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("total", "doubled", "upper")]
    result = triton.infer("mixed", [a, b, s], outputs=outputs, response_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("total"), values.sum(axis=1))
    with httpx.Client(base_url=server.url) as http:
        big = http.post(f"/v1/models/{HALF_PLUS_TWO}:predict", json={"instances": [[float(i)] for i in range(400)]},
                        headers={"Accept-Encoding": algorithm})
        assert big.headers["content-encoding"] == algorithm and int(big.headers["content-length"]) < len(big.content)
        assert big.json()["predictions"][:2] == [[2.0], [2.5]]
        small = http.post(f"/v1/models/{HALF_PLUS_TWO}:predict", json={"instances": [[1.0]]},
                          headers={"Accept-Encoding": algorithm})
        plain = http.post(f"/v1/models/{HALF_PLUS_TWO}:predict", json={"instances": [[float(i)] for i in range(400)]},
                          headers={"Accept-Encoding": "identity"})
        refused = http.post(f"/v1/models/{HALF_PLUS_TWO}:predict", json={"instances": [[float(i)] for i in range(400)]},
                            headers={"Accept-Encoding": f"{algorithm};q=0"})
    assert "content-encoding" not in small.headers and small.json() == {"predictions": [[2.5]]}
    assert "content-encoding" not in plain.headers and "content-encoding" not in refused.headers


def test_compressed_bodies_are_undone_once_or_refused(server):
    import gzip
    import zlib

    body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 3.0]}]}'
    path = f"/v2/models/{HALF_PLUS_TWO}/infer"
    with server.client() as http:
        for encoded, encoding in ((gzip.compress(body), "gzip"), (zlib.compress(body), "deflate"),
                                  (zlib.compress(body)[2:-4], "deflate"), (body, "identity")):
            got = http.post(path, content=encoded, headers={"Content-Encoding": encoding})
            assert got.status_code == 200 and got.json()["outputs"][0]["data"] == [2.5, 3.5], (encoding, got.text)
        # the same body through TF Serving's door and /invocations: one place undoes it
        tfs = http.post(f"/v1/models/{HALF_PLUS_TWO}:predict", content=gzip.compress(b'{"instances": [1.0]}'),
                        headers={"Content-Encoding": "gzip"})
        assert tfs.json() == {"predictions": [2.5]}
        unknown = http.post(path, content=body, headers={"Content-Encoding": "br"})
        assert unknown.status_code == 415 and "Content-Encoding 'br' is not supported" in unknown.json()["error"]
        broken = http.post(path, content=b"not gzip at all", headers={"Content-Encoding": "gzip"})
        assert broken.status_code == 400 and "not valid gzip" in broken.json()["error"]
        cut = http.post(path, content=gzip.compress(body)[:20], headers={"Content-Encoding": "gzip"})
        assert cut.status_code == 400, cut.text
        bomb = gzip.compress(b"0" * (101 * 2**20))  # ~100 KB that expands past the 100 MB limit
        refused = http.post(path, content=bomb, headers={"Content-Encoding": "gzip"})
        assert refused.status_code == 413 and "expands past the limit" in refused.json()["error"]


def test_answers_equal_tf_servings_rest(server):
    with server.client() as http:
        tfs = http.post(f"/v1/models/{HALF_PLUS_TWO}:predict", json={"instances": [[1.0], [2.0], [5.0]]}).json()
        v2 = http.post(f"/v2/models/{HALF_PLUS_TWO}/infer", json={
            "inputs": [{"name": "x", "shape": [3, 1], "datatype": "FP32", "data": [[1.0], [2.0], [5.0]]}]}).json()
    assert [row[0] for row in tfs["predictions"]] == v2["outputs"][0]["data"]
    assert v2["model_version"] == "123" and v2["outputs"][0]["shape"] == [3, 1]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"not json", 400, "not JSON"),
        (b'{"inputs": []}', 400, "non-empty list"),
        (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1]}]}', 400, "1 values for shape [2]"),
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "BF16", "data": [1]}]}', 400, "datatype 'BF16'"),
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}',
         400, "runs past"),
        # found by schemathesis (test_openapi.py): 500s before
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "parameters": [null]}]}',
         400, '"parameters" of input x must be an object'),
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": {}, "data": [1]}]}', 400, "datatype {}"),
    ],
)
def test_bad_requests_get_v2_errors(server, body, status, says):
    with server.client() as http:
        got = http.post(f"/v2/models/{HALF_PLUS_TWO}/infer", content=body)
        assert got.status_code == status and says in got.json()["error"]
        assert http.post("/v2/models/nope/infer", content=b'{"inputs": []}').status_code in (400, 404)
        assert http.get("/v2/models/nope/ready").status_code == 404


def test_v2_and_tf_serving_callers_batched_together_get_their_own_rows(server):
    # tritonclient's HTTP client runs on gevent and must stay on one thread: concurrent V2
    # callers here send the same JSON it would, each from its own thread.
    errors: list[str] = []

    def v2_caller(i: int) -> None:
        body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [float(i)]}]}
        with server.client() as http:
            got = http.post(f"/v2/models/{HALF_PLUS_TWO}/infer", json=body).json()
        if got["outputs"][0]["data"] != [i * 0.5 + 2]:
            errors.append(f"v2 {i}: {got}")

    def tfs_caller(i: int) -> None:
        with server.client() as http:
            got = http.post(f"/v1/models/{HALF_PLUS_TWO}:predict", json={"instances": [[1000.0 + i]]}).json()
        if got["predictions"][0][0] != (1000 + i) * 0.5 + 2:
            errors.append(f"tfs {i}: {got}")

    threads = [threading.Thread(target=f, args=(i,)) for i in range(24) for f in (v2_caller, tfs_caller)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


# -- V2 over gRPC (same port as TF Serving's services) ------------------------------------------


@pytest.fixture(scope="module")
def triton_grpc(server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_target)
    yield client
    client.close()


def test_grpc_metadata_readiness_and_infer(triton_grpc):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    assert triton_grpc.is_server_live() and triton_grpc.is_server_ready()
    assert triton_grpc.is_model_ready(HALF_PLUS_TWO)
    assert triton_grpc.get_server_metadata().name == "tfservo"
    meta = triton_grpc.get_model_metadata("mixed")
    assert {(t.name, t.datatype, tuple(t.shape)) for t in meta.inputs} == {
        ("a", "FP32", (-1, 2)), ("b", "INT64", (-1,)), ("s", "BYTES", (-1,))}
    inputs = []
    for name, value, datatype in (("a", np.array([[1, 2]], np.float32), "FP32"), ("b", np.array([5], np.int64), "INT64"),
                                  ("s", np.array([b"xy"], dtype=object), "BYTES")):
        tensor = grpcclient.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    result = triton_grpc.infer("mixed", inputs, request_id="g-1")
    np.testing.assert_array_equal(result.as_numpy("total"), [3.0])
    np.testing.assert_array_equal(result.as_numpy("doubled"), [10])
    assert list(result.as_numpy("upper")) == [b"XY"]
    assert result.get_response().id == "g-1"
    with pytest.raises(InferenceServerException) as caught:
        triton_grpc.infer("nope", inputs)
    assert "StatusCode.NOT_FOUND" in str(caught.value.status()) or "NOT_FOUND" in str(caught.value)


def test_grpc_bad_tensors_are_invalid_argument(server):
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name=HALF_PLUS_TWO, raw_input_contents=[b"\x00\x00\x80\x3f"])
    request.inputs.add(name="x", datatype="FP32", shape=[2])  # 4 bytes for 2 floats
    with grpc.insecure_channel(server.grpc_target) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "4 bytes for shape [2] of FP32" in caught.value.details()


def test_statistics_extension_over_rest_and_grpc(server, triton, triton_grpc):
    """Triton's get_inference_statistics on both doors: every inference counts, whichever door
    it came through, with its time; the model's executions (here batched) with theirs."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    def stats() -> dict:
        (entry,) = triton.get_inference_statistics(HALF_PLUS_TWO)["model_stats"]
        return entry

    before = stats()
    x = httpclient.InferInput("x", [2], "FP32")
    x.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
    for _ in range(3):
        triton.infer(HALF_PLUS_TWO, [x])
    y = grpcclient.InferInput("x", [2], "FP32")
    y.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
    for _ in range(2):
        triton_grpc.infer(HALF_PLUS_TWO, [y])
    with server.client() as http:  # TF Serving's door counts too: one model, one set of statistics
        assert http.post(f"/v1/models/{HALF_PLUS_TWO}:predict", json={"instances": [1.0]}).status_code == 200
    after = stats()
    assert after["name"] == HALF_PLUS_TWO and after["version"] == "123"
    success = after["inference_stats"]["success"]
    assert int(success["count"]) - int(before["inference_stats"]["success"]["count"]) == 6
    assert int(success["ns"]) > int(before["inference_stats"]["success"]["ns"])
    assert int(after["execution_count"]) > int(before["execution_count"])
    assert int(after["last_inference"]) > 0
    rpc = triton_grpc.get_inference_statistics(HALF_PLUS_TWO, as_json=True)["model_stats"][0]
    assert int(rpc["inference_stats"]["success"]["count"]) == int(success["count"])
    every = {(m["name"], m["version"]) for m in triton.get_inference_statistics()["model_stats"]}
    assert {(HALF_PLUS_TWO, "123"), ("mixed", "1")} <= every
    assert "statistics" in triton.get_server_metadata()["extensions"]
    for client in (triton, triton_grpc):
        with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
            client.get_inference_statistics("nope")


def test_model_configuration_extension_over_rest_and_grpc(triton, triton_grpc):
    """Triton's get_model_config: the signature's tensors in ModelConfig's fields and types."""
    rest = triton.get_model_config("mixed")
    assert (rest["name"], rest["platform"], rest["backend"], rest["max_batch_size"]) == \
        ("mixed", "tensorflow_savedmodel", "tensorflow", 0)
    assert {(t["name"], t["data_type"], tuple(t["dims"])) for t in rest["input"]} == {
        ("a", "TYPE_FP32", (-1, 2)), ("b", "TYPE_INT64", (-1,)), ("s", "TYPE_STRING", (-1,))}
    assert {(t["name"], t["data_type"]) for t in rest["output"]} == {
        ("total", "TYPE_FP32"), ("doubled", "TYPE_INT64"), ("upper", "TYPE_STRING")}
    rpc = triton_grpc.get_model_config("mixed", as_json=True)["config"]  # read through tritonclient's own proto
    assert {(t["name"], t["data_type"], tuple(int(d) for d in t["dims"])) for t in rpc["input"]} == {
        ("a", "TYPE_FP32", (-1, 2)), ("b", "TYPE_INT64", (-1,)), ("s", "TYPE_STRING", (-1,))}
    assert rpc["name"] == "mixed" and rpc["platform"] == "tensorflow_savedmodel"
    assert triton.get_model_config(HALF_PLUS_TWO, "123")["input"][0]["name"] == "x"


def test_triton_words_on_the_v2_door(server, triton_grpc):
    """What tritonclient's callers check: unknown models and version strings in Triton's words,
    a model that is not loaded reads as not ready over gRPC, and raw contents exclude contents."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    from tritonclient.utils import InferenceServerException

    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    with server.client() as http:
        got = http.post("/v2/models/nope/infer", json=body)
        assert got.status_code == 404 and got.json()["error"] == "Request for unknown model: 'nope' is not found"
        got = http.post(f"/v2/models/{HALF_PLUS_TWO}/versions/x1/infer", json=body)
        assert got.status_code == 400
        assert got.json()["error"] == "failed to get model version from specified version string 'x1'"
        assert http.get("/v2/models/nope/ready").status_code == 404
    assert triton_grpc.is_model_ready("nope") is False  # Triton: ready false, not NOT_FOUND
    assert triton_grpc.is_model_ready(HALF_PLUS_TWO, "999") is False
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        triton_grpc.get_model_metadata("nope")
    request = service_pb2.ModelInferRequest(model_name=HALF_PLUS_TWO, raw_input_contents=[b"\x00\x00\x80\x3f"])
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(1.0)  # both: the protocol says contents must not be given
    with grpc.insecure_channel(server.grpc_target) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == (f"contents field must not be specified when using raw_input_contents for 'x' "
                                      f"for model '{HALF_PLUS_TWO}'")


# -- the model repository extension (multi-model mode) ----------------------------------------


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    import shutil

    root = tmp_path_factory.mktemp("repository")
    shutil.copytree(TFS / HALF_PLUS_TWO, root / "two")
    shutil.copytree(TFS / "saved_model_half_plus_three", root / "three")
    shutil.copytree(TFS / "saved_model_half_plus_two_2_versions", root / "versions")
    outside = tmp_path_factory.mktemp("outside")
    shutil.copytree(TFS / HALF_PLUS_TWO, outside / "secret")
    (root / "escape").symlink_to(outside / "secret")
    server = ServerProcess(["--multi-model", "--model-root", str(root)]).start()
    yield server
    server.stop()


def test_repository_index_load_unload_over_rest_and_grpc(repository):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    rest = httpclient.InferenceServerClient(repository.url.removeprefix("http://"))
    rpc = grpcclient.InferenceServerClient(repository.grpc_target)
    try:
        assert {(m["name"], m["state"]) for m in rest.get_model_repository_index()} == {
            ("escape", "UNAVAILABLE"), ("two", "UNAVAILABLE"), ("three", "UNAVAILABLE"), ("versions", "UNAVAILABLE")}
        rest.load_model("two")
        assert rest.is_model_ready("two")
        rpc.load_model("three")
        assert rpc.is_model_ready("three")
        index = rpc.get_model_repository_index()
        assert {(m.name, m.state) for m in index.models if m.state == "READY"} == {("two", "READY"), ("three", "READY")}
        x = httpclient.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[2.0]], np.float32))
        assert rest.infer("two", [x]).as_numpy("y")[0][0] == 3.0
        rpc.unload_model("three")
        rest.unload_model("two")
        assert not any(m["state"] == "READY" for m in rest.get_model_repository_index())
        with pytest.raises(InferenceServerException, match="outside the model root"):
            rest.load_model("escape")  # a link out of the root: the /models API's confinement
        with pytest.raises(InferenceServerException, match="outside the model root"):
            rpc.load_model("escape")
    finally:
        rest.close()
        rpc.close()


def test_repository_load_parameters_are_checked_not_ignored(repository):
    """Triton's load parameters over REST and gRPC: a config that is not the model's JSON, model
    contents in the request and unknown parameters fail, and the model stays as it was."""
    import httpx
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    rest = httpclient.InferenceServerClient(repository.url.removeprefix("http://"))
    rpc = grpcclient.InferenceServerClient(repository.grpc_target)
    try:
        for client in (rest, rpc):
            with pytest.raises(InferenceServerException, match="the 'config' parameter is not JSON"):
                client.load_model("two", config="{not json")
            with pytest.raises(InferenceServerException, match="its config names model 'three'"):
                client.load_model("two", config='{"name": "three"}')
            with pytest.raises(InferenceServerException, match="model contents in the request"):
                client.load_model("two", config='{"name": "two"}', files={"file:1/saved_model.pb": b"not a model"})
            assert not client.is_model_ready("two")
        with httpx.Client(base_url=repository.url) as http:
            got = http.post("/v2/repository/models/two/load", json={"parameters": {"no_such_parameter": 1}})
            assert got.status_code == 400 and "unexpected parameter 'no_such_parameter'" in got.json()["error"]
        rest.load_model("two", config='{"name": "two", "platform": "tensorflow_savedmodel", "max_batch_size": 8}')
        assert rest.is_model_ready("two")
        rest.unload_model("two")
    finally:
        rest.close()
        rpc.close()


def test_a_load_config_is_honoured_where_it_maps_and_refused_where_not(repository):
    """Triton's model-control example's config (max_batch_size as protobuf's JSON writes it) and
    a version policy change what the configuration extension reports and what is served; fields
    tfservo has no setting for are refused by name; Triton's words where its examples read them."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    rest = httpclient.InferenceServerClient(repository.url.removeprefix("http://"))
    rpc = grpcclient.InferenceServerClient(repository.grpc_target)
    try:
        rest.load_model("two")
        assert rest.get_model_config("two")["max_batch_size"] == 0
        assert rest.get_model_config("two")["input"][0]["dims"] == [-1, 1]
        rpc.load_model("two", config='{"max_batch_size":"16", "dynamic_batching": {"max_queue_delay_microseconds": 500}}')
        config = rpc.get_model_config("two", as_json=True)["config"]
        assert (config["max_batch_size"], config["dynamic_batching"]["max_queue_delay_microseconds"]) == (16, "500")
        assert rest.get_model_config("two")["input"][0]["dims"] == [1]  # the batch dim is max_batch_size's
        x = httpclient.InferInput("x", [3, 1], "FP32")
        x.set_data_from_numpy(np.array([[1], [2], [3]], np.float32))
        assert rest.infer("two", [x]).as_numpy("y").tolist() == [[2.5], [3.0], [3.5]]
        with pytest.raises(InferenceServerException, match="failed to load 'two': config field.*'instance_group'"):
            rest.load_model("two", config='{"instance_group": [{"kind": "KIND_GPU"}]}')
        with pytest.raises(InferenceServerException, match="failed to load"):  # the example's malformed config
            rest.load_model("two", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
        assert rest.get_model_config("two")["max_batch_size"] == 16  # a refused load leaves the model as it was
        rest.unload_model("two")
        rest.load_model("versions", config='{"version_policy": {"specific": {"versions": [123]}}}')
        assert rest.is_model_ready("versions", "123") and not rest.is_model_ready("versions", "124")
        assert rest.get_model_config("versions")["version_policy"] == {"specific": {"versions": [123]}}
        rest.load_model("versions", config='{"version_policy": {"latest": {"num_versions": 1}}}')
        assert rest.is_model_ready("versions", "124") and not rest.is_model_ready("versions", "123")
        rest.unload_model("versions")
        with pytest.raises(InferenceServerException, match="failed to load 'wrong_model_name'"):
            rpc.load_model("wrong_model_name")
        with pytest.raises(InferenceServerException, match="failed to poll from model repository") as refused:
            rpc.load_model("two", config="{}", files={"file:" + "A" * 256: b"a"})
        assert refused.value.status() == "StatusCode.INTERNAL" and rpc.is_server_live()
    finally:
        rest.close()
        rpc.close()


# -- the KServe Python client (REST V1 and V2, gRPC V2) ------------------------------------------
# In its own process: kserve's generated V2 protos and tritonclient's define the same symbols
# in protobuf's default pool, so the two clients cannot be imported into one interpreter.

KSERVE_CLIENT = """
import asyncio, json, sys
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

url, grpc_target, plain_model = sys.argv[1:4]

def request(binary):
    inputs = []
    for name, value, datatype in (("a", np.array([[1, 2], [3, 4]], np.float32), "FP32"),
                                  ("b", np.array([5, 6], np.int64), "INT64"),
                                  ("s", np.array([b"xy", b"z"], dtype=object), "BYTES")):
        tensor = InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    return InferRequest("mixed", inputs, request_id="k-1")

def outputs(response):
    def cell(v):
        return v.decode() if isinstance(v, bytes) else v
    return {"id": response.id, **{o.name: [cell(v) for v in o.as_numpy().tolist()] for o in response.outputs}}

async def main():
    out = {}
    for protocol in ("v2", "v1"):
        client = InferenceRESTClient(RESTConfig(protocol=protocol, retries=0, timeout=60))
        try:
            if protocol == "v2":
                out["ready"] = await client.is_server_ready(url) and await client.is_model_ready(url, "mixed")
                for binary in (False, True):
                    out[f"rest-{binary}"] = outputs(await client.infer(url, request(binary), model_name="mixed"))
            else:
                out["v1"] = await client.infer(url, {"instances": [1.0, 2.0]}, model_name=plain_model)
        finally:
            await client.close()
    client = InferenceGRPCClient(grpc_target, retries=0, timeout=60)
    try:
        out["grpc-ready"] = await client.is_server_live() and await client.is_model_ready("mixed")
        out["grpc"] = outputs(await client.infer(request(False)))
    finally:
        await client.close()
    print(json.dumps(out))

asyncio.run(main())
"""


def test_kserve_python_client_over_rest_v1_v2_and_grpc(server):
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", KSERVE_CLIENT, server.url, server.grpc_target, HALF_PLUS_TWO],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    mixed = {"id": "k-1", "total": [3.0, 7.0], "doubled": [10, 12], "upper": ["XY", "Z"]}
    assert got["ready"] and got["grpc-ready"]
    assert got["rest-False"] == got["rest-True"] == got["grpc"] == mixed  # JSON and binary tensors, gRPC
    assert got["v1"] == {"predictions": [2.5, 3.0]}  # KServe's V1 is TF Serving's :predict


def test_v2_bodies_over_the_size_limit_get_413_in_v2_shape(http):
    """The shared server runs with --max-request-mb 4; V2 shares the limit of every route."""
    data = b",".join([b"1.0"] * 1_400_000)
    body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1400000], "data": [' + data + b"]}]}"
    got = http.post("/v2/models/saved_model_half_plus_three/infer", content=body)
    assert got.status_code == 413 and "--max-request-mb" in got.json()["error"]
