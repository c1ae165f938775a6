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
    ],
)
def test_bad_requests_get_v2_errors(server, body, status, says):
    with server.client() as http:
        got = http.post(f"/v2/models/{HALF_PLUS_TWO}/infer", content=body)
        assert got.status_code == status and says in got.json()["error"]
        assert http.post("/v2/models/nope/infer", content=b'{"inputs": []}').status_code in (400, 404)
        assert http.get("/v2/models/nope/ready").status_code == 404


def test_v2_and_tf_serving_callers_batched_together_get_their_own_rows(server, triton):
    import tritonclient.http as httpclient

    errors: list[str] = []

    def v2_caller(i: int) -> None:
        x = np.full((1, 1), float(i), np.float32)
        tensor = httpclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(x)
        got = triton.infer(HALF_PLUS_TWO, [tensor]).as_numpy("y")
        if got[0][0] != i * 0.5 + 2:
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
