"""GET /metrics, access logs and /ping health on a real `tfservo serve` with REST and gRPC traffic."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tensorflow as tf
from conftest import TFS
from prometheus_client.parser import text_string_to_metric_families
from server_process import ServerProcess
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

M = "saved_model_half_plus_two_2_versions"
BAD = "bad_half_plus_two"
THREE = "saved_model_half_plus_three"  # a second batched model, for per-model batch metrics
PREDICT_ROUTE = "/v1/models/{name}:predict"


@pytest.fixture(scope="module")
def server():
    args = [str(TFS / M), str(TFS / BAD), str(TFS / THREE), "--enable-batching", "--log-level", "debug"]
    with ServerProcess(args, env={"SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": "2000", "SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES": "64"}) as proc:
        yield proc


@pytest.fixture(scope="module")
def http(server):
    with server.client() as client:
        yield client


@pytest.fixture(scope="module")
def predictions(server):
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def scrape(http) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics, keyed by (sample name, labels)."""
    r = http.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def sample(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def grpc_predict(predictions, name: str, xs) -> grpc.StatusCode:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.asarray(xs, np.float32).reshape(-1, 1)))
    try:
        predictions.Predict(request, timeout=30)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def rest_labels(route=PREDICT_ROUTE, method="predict", model=M, version="124", status="200"):
    return dict(protocol="http", model=model, version=version, method=method, route=route, status=status)


def test_rest_and_grpc_traffic_is_counted_with_its_labels(http, predictions):
    before = scrape(http)
    for _ in range(3):
        assert http.post(f"/v1/models/{M}:predict", content=b'{"instances": [1.0]}').status_code == 200
    assert http.post(f"/v1/models/{M}/versions/123:predict", content=b'{"instances": [1.0]}').status_code == 200
    assert http.post("/v1/models/nope:predict", content=b'{"instances": [1.0]}').status_code == 404
    assert http.post(f"/v1/models/{M}:predict", content=b'{"instances": ').status_code == 400
    assert http.get(f"/v1/models/{M}/metadata").status_code == 200
    r = http.post(
        "/invocations",
        content=b'{"signature_name": "regress_x_to_y", "examples": [{"x": 80.0}]}',
        headers={"Content-Type": "application/json",
                 "X-Amzn-SageMaker-Custom-Attributes": f"tfs-model-name={M},tfs-method=regress"},
    )
    assert r.status_code == 200, r.text
    assert grpc_predict(predictions, M, [1.0, 2.0]) == grpc.StatusCode.OK
    assert grpc_predict(predictions, "nope", [1.0]) == grpc.StatusCode.NOT_FOUND
    after = scrape(http)

    def delta(**labels):
        return sample(after, "tfservo_requests_total", **labels) - sample(before, "tfservo_requests_total", **labels)

    assert delta(**rest_labels()) == 3
    assert delta(**rest_labels(route="/v1/models/{name}/versions/{version}:predict", version="123")) == 1
    # An unknown model name never becomes a label value: clients cannot grow the label set.
    assert delta(**rest_labels(model="", version="", status="404")) == 1
    assert delta(**rest_labels(version="", status="400")) == 1  # failed before a version was chosen
    assert delta(**rest_labels(route="/v1/models/{name}/metadata", method="metadata")) == 1
    assert delta(**rest_labels(route="/invocations", method="regress")) == 1
    grpc_route = "/tensorflow.serving.PredictionService/Predict"
    assert delta(protocol="grpc", model=M, version="124", method="predict", route=grpc_route, status="OK") == 1
    assert delta(protocol="grpc", model="", version="", method="predict", route=grpc_route, status="NOT_FOUND") == 1
    assert not any(dict(labels).get("model") == "nope" for _, labels in after)

    hist = {k: v for k, v in rest_labels().items() if k != "status"}
    count = sample(after, "tfservo_request_duration_seconds_count", **hist)
    assert count - sample(before, "tfservo_request_duration_seconds_count", **hist) == 3
    assert sample(after, "tfservo_request_duration_seconds_bucket", le="+Inf", **hist) == count
    assert sample(after, "tfservo_request_duration_seconds_sum", **hist) > 0


def test_model_load_time_and_state(http):
    samples = scrape(http)
    for version in ("123", "124"):
        assert sample(samples, "tfservo_model_state", model=M, version=version, state="AVAILABLE") == 1
        assert sample(samples, "tfservo_model_state", model=M, version=version, state="END") == 0
        assert sample(samples, "tfservo_model_load_seconds", model=M, version=version) > 0
    assert sample(samples, "tfservo_model_state", model=BAD, version="123", state="END") == 1
    assert sample(samples, "tfservo_model_state", model=BAD, version="123", state="AVAILABLE") == 0
    assert sample(samples, "tfservo_model_load_failures_total", model=BAD, version="123") == 1


def test_batch_metrics_are_labelled_by_model(http):
    """Two models batching at once: each model's batch metrics count exactly its own rows."""
    before = scrape(http)
    rows = {M: 3, THREE: 2}
    jobs = [M, THREE] * 12  # interleaved, so both models' batchers run side by side

    def call(name: str) -> int:
        body = json.dumps({"instances": [[1.0]] * rows[name]}).encode()
        return http.post(f"/v1/models/{name}:predict", content=body).status_code

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(call, jobs)) == [200] * len(jobs)
    after = scrape(http)

    def delta(name: str, model: str) -> float:
        return sample(after, name, model=model) - sample(before, name, model=model)

    for model in (M, THREE):
        batches = delta("tfservo_batch_size_count", model)
        assert 1 <= batches <= jobs.count(model), model
        assert delta("tfservo_batch_size_sum", model) == rows[model] * jobs.count(model), model
        assert delta("tfservo_batch_run_seconds_count", model) == batches, model
        # the saturation signal counts the batches' model time, as the batch histogram does
        busy = delta("tfservo_model_busy_seconds_total", model)
        assert busy > 0 and busy == pytest.approx(delta("tfservo_batch_run_seconds_sum", model), rel=1e-6), model
    # Every batch series names its model; a model that never batched has none.
    batch_series = [labels for name, labels in after if name.startswith("tfservo_batch_")]
    assert batch_series and {dict(labels).get("model") for labels in batch_series} == {M, THREE}


def test_the_busy_seconds_of_unbatched_calls_rise_with_offered_load():
    """rate(tfservo_model_busy_seconds_total) is the share of time a model computes: it grows with
    the calls it answers and never passes the wall time they took (one call at a time here)."""
    with ServerProcess([str(TFS / M), "--batching", "off", "--no-supervisor"]) as proc, proc.client() as http:
        def busy() -> float:
            return sample(scrape(http), "tfservo_model_busy_seconds_total", model=M)

        body = json.dumps({"instances": [[1.0]] * 64})
        assert http.post(f"/v1/models/{M}:predict", content=body).status_code == 200
        time.sleep(0.1)  # the bulk writer's period (20 ms), with room
        light = busy()
        started = time.monotonic()
        for _ in range(200):
            assert http.post(f"/v1/models/{M}:predict", content=body).status_code == 200
        elapsed = time.monotonic() - started
        time.sleep(0.1)
        heavy = busy()
        assert light > 0 and 0 < heavy - light < elapsed, (light, heavy, elapsed)


def test_the_model_in_flight_and_batch_queue_gauges_rise_with_offered_load(slow_model):
    """Four requests at once to a 1 s model batched one row at a time on one thread: all four
    hold the model, the ones behind the running batch wait in its queue, and both gauges
    fall back to 0 once they are answered."""
    env = {"SAGEMAKER_TFS_MAX_BATCH_SIZE": "1", "SAGEMAKER_TFS_NUM_BATCH_THREADS": "1",
           "SAGEMAKER_TFS_ENABLE_BATCHING": "true"}
    with ServerProcess([str(slow_model), "--no-supervisor"], env=env) as proc, proc.client() as http:
        def gauges() -> tuple[float, float]:
            samples = scrape(http)
            return (sample(samples, "tfservo_model_requests_in_flight", model="slow"),
                    sample(samples, "tfservo_batch_queued_rows", model="slow"))

        assert http.post("/v1/models/slow:predict", content=b'{"instances": [1.0]}').status_code == 200
        time.sleep(0.1)
        assert gauges() == (0, 0)
        with ThreadPoolExecutor(4) as pool:
            answers = [pool.submit(http.post, "/v1/models/slow:predict", content=b'{"instances": [1.0]}')
                       for _ in range(4)]
            time.sleep(0.6)  # all four arrived; the first batch runs for 1 s
            held, queued = gauges()
            assert held == 4 and 1 <= queued <= 3, (held, queued)
            assert all(a.result().status_code == 200 for a in answers)
        time.sleep(0.1)
        assert gauges() == (0, 0)


def test_access_log_has_one_line_per_request(http, server):
    assert http.get(f"/v1/models/{M}").status_code == 200
    deadline = time.monotonic() + 10  # logged once the answer is out; then through the pipe
    while not (lines := [x for x in server.lines if "tfservo.access" in x and "route=/v1/models/{name} " in x]):
        assert time.monotonic() < deadline, server.output[-3000:]
        time.sleep(0.05)
    assert f"method=status model={M} version=- status=200" in lines[-1]


def test_ping_is_503_while_a_configured_model_has_no_available_version(http):
    r = http.get("/ping")
    assert r.status_code == 503
    assert BAD in r.json()["error"] and M not in r.json()["error"]
    # The good model still serves, and the failed one reports why.
    assert http.post(f"/v1/models/{M}:predict", content=b'{"instances": [2.0]}').json() == {"predictions": [3.0]}
    status = http.get(f"/v1/models/{BAD}").json()["model_version_status"]
    assert [(s["version"], s["state"]) for s in status] == [("123", "END")]
    assert status[0]["status"]["error_code"] != "OK" and status[0]["status"]["error_message"]
    assert http.post(f"/v1/models/{BAD}:predict", content=b'{"instances": [2.0]}').status_code == 404


def test_metrics_of_several_workers_add_up(tmp_path):
    """With --workers, each worker's /metrics reports the traffic of all of them."""
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    with ServerProcess([str(TFS / M), "--workers", "2"], env=env) as proc, proc.client() as client:
        for _ in range(10):
            assert client.post(f"/v1/models/{M}:predict", content=b'{"instances": [1.0]}').status_code == 200
        for _ in range(3):  # whichever worker answers, it counts every worker's requests
            samples = scrape(client)
            assert sample(samples, "tfservo_requests_total", **rest_labels()) == 10
        states = [v for (name, labels), v in samples.items()
                  if name == "tfservo_model_state" and dict(labels).get("state") == "AVAILABLE"]
        assert states and all(v == 1 for v in states)


def test_open_inference_protocol_traffic_is_labelled_v2(http, server):
    import tritonclient.grpc as grpcclient

    before = scrape(http)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]}
    assert http.post(f"/v2/models/{M}/infer", json=body).status_code == 200
    assert http.post("/v2/models/nope/infer", json=body).status_code == 404
    with grpcclient.InferenceServerClient(server.grpc_target) as client:
        x = grpcclient.InferInput("x", [2], "FP32")
        x.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
        client.infer(M, [x])
    after = scrape(http)

    def delta(**labels):
        return sample(after, "tfservo_requests_total", **labels) - sample(before, "tfservo_requests_total", **labels)

    rest = dict(protocol="v2", model=M, version="124", method="predict", route="/v2/models/{name}/infer")
    assert delta(**rest, status="200") == 1
    assert delta(**{**rest, "model": "", "version": ""}, status="404") == 1
    grpc_route = "/inference.GRPCInferenceService/ModelInfer"
    assert delta(**{**rest, "route": grpc_route}, status="OK") == 1
    assert delta(protocol="http", model=M, version="124", method="predict", route="/v2/models/{name}/infer",
                 status="200") == 0
