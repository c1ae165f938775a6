"""Server-side batching against real `tfservo serve` processes (1 and 2 workers).

Many concurrent clients send distinct rows; every answer must hold exactly the caller's own
rows (in order), nothing may be lost and nothing may fail. Also: a request over the max batch
size is split, inputs of different widths are never merged, and a full queue answers 429 /
RESOURCE_EXHAUSTED at once.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from conftest import TFS
from server_process import ServerProcess

MAX_BATCH = 4
HALF_PLUS_TWO = "saved_model_half_plus_two_cpu"
BATCHING_ENV = {
    "SAGEMAKER_TFS_ENABLE_BATCHING": "true",
    "SAGEMAKER_TFS_MAX_BATCH_SIZE": str(MAX_BATCH),
    "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": "5000",  # long enough that concurrent calls share batches
    "SAGEMAKER_TFS_NUM_BATCH_THREADS": "2",
    "SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES": "1000",
    "SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "echo",
}
SLEEP_MICROS = 400_000


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """`echo`: x float32[-1, -1] → y = 2x and rowsum; `slow`: x float32[-1] → x + 1 after 0.4 s."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing as tf_data_testing

    root = tmp_path_factory.mktemp("batching_models")

    class Echo(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32, name="x")])
        def serve(self, x):
            return {"y": x * 2.0, "rowsum": tf.reduce_sum(x, axis=1)}

    class Slow(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            delayed = tf.data.Dataset.from_tensors(x).apply(tf_data_testing.sleep(SLEEP_MICROS))
            return {"y": delayed.get_single_element() + 1.0}

    for name, module in (("echo", Echo()), ("slow", Slow())):
        tf.saved_model.save(
            module, str(root / name / "1"), signatures={"serving_default": module.serve.get_concrete_function()}
        )
    return {"echo": str(root / "echo"), "slow": str(root / "slow")}


@pytest.fixture(scope="module", params=[1, 2], ids=["1-worker", "2-workers"])
def batched_server(request, models, testdata):
    server = ServerProcess(
        [models["echo"], str(TFS / HALF_PLUS_TWO), "--workers", str(request.param)],
        env=BATCHING_ENV,
    ).start()
    yield server
    server.stop()


def _rows(client: int, call: int, n: int, width: int) -> list[list[float]]:
    """Rows no other call sends: the values encode (client, call, row, column)."""
    return [[float(client * 20_000 + call * 1_000 + r * 10 + c) for c in range(width)] for r in range(n)]


def _check_echo(doc: dict, rows: list[list[float]]) -> None:
    x = np.asarray(rows)
    got = doc["predictions"]
    assert len(got) == len(rows), f"sent {len(rows)} rows, got {len(got)} back"
    assert [p["y"] for p in got] == (2 * x).tolist()
    assert [p["rowsum"] for p in got] == x.sum(axis=1).tolist()


def _one_client(url: str, client: int, calls: int) -> tuple[int, int, list[str]]:
    """One client's mix of REST predict, /invocations, regress and classify; (calls, row chunks, failures)."""
    failures: list[str] = []
    chunks = 0
    width = 3 if client % 2 else 5  # concurrent calls with different non-batch dims
    with httpx.Client(base_url=url, timeout=60) as http:
        for call in range(calls):
            kind = (client + call) % 4
            n = 1 + (client + call) % 3
            if client == 0 and call == 0:
                n = 3 * MAX_BATCH - 1  # over the max batch size: split, not refused
            chunks += -(-n // MAX_BATCH)
            rows = _rows(client, call, n, width)
            try:
                if kind == 0:
                    r = http.post("/v1/models/echo:predict", json={"instances": rows})
                    assert r.status_code == 200, r.text
                    _check_echo(r.json(), rows)
                elif kind == 1:
                    r = http.post(
                        "/invocations",
                        json={"instances": rows},
                        headers={"X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=echo"},
                    )
                    assert r.status_code == 200, r.text
                    _check_echo(r.json(), rows)
                else:
                    xs = [row[0] for row in rows]
                    method = "regress" if kind == 2 else "classify"
                    r = http.post(
                        f"/v1/models/{HALF_PLUS_TWO}:{method}",
                        json={"signature_name": f"{method}_x_to_y", "examples": [{"x": x} for x in xs]},
                    )
                    assert r.status_code == 200, r.text
                    want = [0.5 * x + 2 for x in xs]
                    if method == "regress":
                        assert r.json() == {"results": want}
                    else:
                        assert r.json() == {"results": [[["", y]] for y in want]}
            except AssertionError as exc:
                failures.append(f"client {client} call {call} ({n}×{width}, kind {kind}): {exc}")
    return calls, chunks, failures


def _batch_counts(http: httpx.Client) -> tuple[float, float]:
    text = http.get("/metrics").text

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    return total("tfservo_batch_size_count"), total("tfservo_batch_size_sum")


def test_concurrent_clients_get_exactly_their_own_rows(batched_server):
    clients, calls = 24, 8
    with batched_server.client() as http:
        before = _batch_counts(http)
        with ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(lambda c: _one_client(batched_server.url, c, calls), range(clients)))
        after = _batch_counts(http)
    failures = [f for _, _, fs in results for f in fs]
    assert not failures, f"{len(failures)} wrong answers, e.g.:\n" + "\n".join(failures[:5])
    assert sum(n for n, _, _ in results) == clients * calls  # every call answered
    batches, rows = after[0] - before[0], after[1] - before[1]
    chunks = sum(c for _, c, _ in results)
    assert rows > 0, "the batcher ran nothing: is batching on?"
    assert batches < chunks, f"{chunks} chunks ran as {batches:g} batches: no two calls were merged"


def _invocation(http: httpx.Client, rows: list[list[float]]) -> list[list[float]]:
    r = http.post("/invocations", json={"instances": rows},
                  headers={"X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=echo"})
    assert r.status_code == 200, r.text
    return [p["y"] for p in r.json()["predictions"]]


def _v2_infer(http: httpx.Client, rows: list[list[float]]) -> list[list[float]]:
    x = np.asarray(rows, np.float32)
    r = http.post("/v2/models/echo/infer", json={"inputs": [
        {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]})
    assert r.status_code == 200, r.text
    (y,) = [o for o in r.json()["outputs"] if o["name"] == "y"]
    return np.asarray(y["data"]).reshape(y["shape"]).tolist()


@pytest.fixture(scope="module")
def default_server(models):
    """The echo model with the defaults: adaptive batching, whose lone calls are quick."""
    server = ServerProcess([models["echo"]]).start()
    yield server
    server.stop()


@pytest.mark.parametrize("door", [_invocation, _v2_infer], ids=["invocations", "v2-infer"])
def test_every_door_shares_batches(default_server, door):
    """Concurrent single-row calls through /invocations or V2 infer alone are merged as
    :predict's are, and each caller gets its own row back. (They once ran one at a time with
    the defaults: a quick model's calls were placed on the event loop, which then waited there
    for each call's batch — every batch held one row, at half the batched rate.)"""
    batched_server = default_server
    clients, calls = 12, 8
    start = threading.Barrier(clients)

    def client(c: int) -> list[str]:
        wrong = []
        with httpx.Client(base_url=batched_server.url, timeout=60) as http:
            start.wait()
            for call in range(calls):
                rows = _rows(300 + c, call, 1, 3)
                got = door(http, rows)
                if got != (2 * np.asarray(rows)).tolist():
                    wrong.append(f"client {c} call {call}: sent {rows}, got {got}")
        return wrong

    with batched_server.client() as http:
        for i in range(5):  # the server learns that the model's calls are quick
            door(http, _rows(299, i, 1, 3))
        before = _batch_counts(http)
        with ThreadPoolExecutor(clients) as pool:
            wrong = [w for ws in pool.map(client, range(clients)) for w in ws]
        after = _batch_counts(http)
    assert not wrong, "\n".join(wrong[:5])
    batches, rows = after[0] - before[0], after[1] - before[1]
    assert rows == clients * calls
    assert batches < rows, f"{rows:g} single-row calls ran as {batches:g} batches: none merged"


def test_queued_v2_call_answers_only_the_outputs_asked_for(default_server):
    with default_server.client() as http:
        r = http.post("/v2/models/echo/infer", json={
            "inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}],
            "outputs": [{"name": "rowsum"}],
        })
    assert r.status_code == 200, r.text
    assert [(o["name"], o["data"]) for o in r.json()["outputs"]] == [("rowsum", [3.0, 7.0])]


def test_widths_never_share_a_batch(batched_server):
    """Calls of width 2 and 7 at the same moment: merged, they could not even be concatenated."""
    start = threading.Barrier(16)

    def call(i: int) -> tuple[int, list[list[float]], dict]:
        rows = _rows(90 + i, 0, 1 + i % 2, 2 if i % 2 else 7)
        with httpx.Client(base_url=batched_server.url, timeout=60) as http:
            start.wait()
            r = http.post("/v1/models/echo:predict", json={"instances": rows})
        return r.status_code, rows, r.json()

    with ThreadPoolExecutor(16) as pool:
        for status, rows, doc in pool.map(call, range(16)):
            assert status == 200, doc
            _check_echo(doc, rows)


@pytest.fixture(scope="module")
def full_queue_server(models):
    """One batch thread, batches of one row, one batch may wait: a third concurrent call is refused."""
    env = {
        **BATCHING_ENV,
        "SAGEMAKER_TFS_MAX_BATCH_SIZE": "1",
        "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": "0",
        "SAGEMAKER_TFS_NUM_BATCH_THREADS": "1",
        "SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES": "1",
        "SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "slow",
    }
    server = ServerProcess([models["slow"]], env=env).start()
    with server.client() as http:  # the first call of a graph is slower; keep it out of the test
        assert http.post("/v1/models/slow:predict", json={"instances": [1.0]}).status_code == 200
    yield server
    server.stop()


@pytest.mark.parametrize("route", ["/v1/models/slow:predict", "/invocations"])
def test_full_queue_answers_429_at_once(full_queue_server, route):
    start = threading.Barrier(6)

    def call(i: int) -> tuple[int, dict, float]:
        with httpx.Client(base_url=full_queue_server.url, timeout=60) as http:
            start.wait()
            t0 = time.monotonic()
            r = http.post(route, json={"instances": [float(i)]})
            return r.status_code, r.json(), time.monotonic() - t0

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(call, range(6)))
    statuses = sorted(s for s, _, _ in answers)
    assert set(statuses) <= {200, 429}, answers
    assert 200 in statuses and 429 in statuses, statuses
    for status, doc, seconds in answers:
        if status == 429:
            assert "batch queue full" in doc["error"] and "SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES" in doc["error"]
            assert seconds < SLEEP_MICROS / 1e6, "a refused call must not wait for the model"
        else:
            assert doc["predictions"][0] in [float(i) + 1 for i in range(6)]


def test_full_queue_is_resource_exhausted_over_grpc(full_queue_server):
    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from tfservo.codecs.tensor_proto import write_tensor_proto

    start = threading.Barrier(6)
    channel = grpc.insecure_channel(full_queue_server.grpc_target)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

    def call(i: int) -> grpc.StatusCode:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "slow"
        write_tensor_proto(np.array([float(i)], np.float32), request.inputs["x"])
        start.wait()
        try:
            stub.Predict(request, timeout=30)
            return grpc.StatusCode.OK
        except grpc.RpcError as exc:
            return exc.code()

    with ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(call, range(6)))
    channel.close()
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes and grpc.StatusCode.OK in codes, codes



def test_batching_eager_from_flag_or_environment():
    from tfservo.core.settings import ConfigError, resolve_batching

    on = {"SAGEMAKER_TFS_ENABLE_BATCHING": "true"}
    assert resolve_batching(False, None, on).eager is False
    assert resolve_batching(False, None, {**on, "TFSERVO_BATCHING_EAGER": "true"}).eager is True
    assert resolve_batching(True, None, {}, eager=True).eager is True
    # Asking for eager batching asks for batching; SageMaker's explicit "false" still wins.
    assert resolve_batching(False, None, {"TFSERVO_BATCHING_EAGER": "true"}).mode == "eager"
    assert resolve_batching(False, None, {"SAGEMAKER_TFS_ENABLE_BATCHING": "false", "TFSERVO_BATCHING_EAGER": "true"}) is None
    with pytest.raises(ConfigError, match="TFSERVO_BATCHING_EAGER='maybe'"):
        resolve_batching(True, None, {"TFSERVO_BATCHING_EAGER": "maybe"})
