"""Deadlines and metrics are the same on every inference door: a call past its time limit ends
with the protocol's word for it (504, DEADLINE_EXCEEDED) and is counted once, with that status,
under its door's route; an answered call is counted as answered.

(Auth, capture and tracing have their own door tables: tests/auth/test_access_parity.py,
tests/capture/test_data_capture.py, tests/tracing/test_traces.py.)"""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from conftest import grpc_predict_request, tfs_grpc
from server_process import ServerProcess
from test_metrics import sample, scrape

V2_BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
TFS_PREDICT = "/tensorflow.serving.PredictionService/Predict"
V2_INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def server(slow_model):
    with ServerProcess([str(slow_model), "--request-timeout", "0.3", "--invocation-timeout", "0.3"]) as proc:
        yield proc


def _rest(path: str, body: dict):
    def call(server: ServerProcess, timeout: float) -> str:
        with server.client() as http:
            answer = http.post(path, json=body)
        if timeout < 1:
            assert "took longer than its limit of 0.3 s" in answer.json()["error"], answer.text
        return str(answer.status_code)

    return call


def _tfs_grpc(server: ServerProcess, timeout: float) -> str:
    with tfs_grpc(server.grpc_target) as (predict, _):
        try:
            answer = predict.Predict(grpc_predict_request("slow", np.array([1.0], np.float32)), timeout=timeout)
        except grpc.RpcError as err:
            return err.code().name
    assert list(answer.outputs["y"].float_val) == [2.0]
    return "OK"


def _v2_grpc(server: ServerProcess, timeout: float) -> str:
    client = triton_grpc.InferenceServerClient(server.grpc_target)
    try:
        x = triton_grpc.InferInput("x", [1], "FP32")
        x.set_data_from_numpy(np.array([1.0], np.float32))
        try:
            answer = client.infer("slow", [x], client_timeout=timeout)
        except triton_grpc.InferenceServerException as err:
            return str(err.status()).removeprefix("StatusCode.")
        assert answer.as_numpy("y").tolist() == [2.0]
        return "OK"
    finally:
        client.close()


# door, protocol label, route label, how to call it with a deadline, (late, answered) statuses
DOORS = [
    ("TF Serving REST", "http", "/v1/models/{name}:predict", _rest("/v1/models/slow:predict", {"instances": [1.0]}),
     ("504", "200")),
    ("SageMaker invocations", "http", "/invocations", _rest("/invocations", {"instances": [1.0]}), ("504", "200")),
    ("V2 REST", "v2", "/v2/models/{name}/infer", _rest("/v2/models/slow/infer", V2_BODY), ("504", "200")),
    ("TF Serving gRPC", "grpc", TFS_PREDICT, _tfs_grpc, ("DEADLINE_EXCEEDED", "OK")),
    ("V2 gRPC", "v2", V2_INFER, _v2_grpc, ("DEADLINE_EXCEEDED", "OK")),
]


@pytest.mark.parametrize(("door", "protocol", "route", "call", "statuses"), DOORS, ids=[d[0] for d in DOORS])
def test_every_door_ends_a_late_call_alike_and_counts_it(server, door, protocol, route, call, statuses) -> None:
    late, _ = statuses
    with server.client() as http:
        before = scrape(http)
        started = time.monotonic()
        assert call(server, 0.3) == late, door
        assert time.monotonic() - started < 0.9, f"{door} answered past its limit"  # the model takes 1 s
        # Counted under its door's route with the protocol's word; its model label too unless the
        # deadline passed before the model was chosen (a loaded machine), so those are summed over.
        deadline = time.monotonic() + 10  # an abandoned call is counted when the server notices
        while counted(scrape(http), protocol, route, late) - counted(before, protocol, route, late) < 1:
            assert time.monotonic() < deadline, f"{door}: the late call was not counted as {late}: {after_of(http)}"
            time.sleep(0.1)


def counted(samples, protocol: str, route: str, status: str) -> float:
    """tfservo_requests_total of one door's route and status, whatever its model label."""
    wanted = {("protocol", protocol), ("route", route), ("status", status)}
    return sum(v for (name, labels), v in samples.items() if name == "tfservo_requests_total" and wanted <= labels)


def after_of(http) -> list:
    return [(dict(labels), v) for (name, labels), v in scrape(http).items() if name == "tfservo_requests_total"]


def test_a_call_within_its_limit_is_answered_on_every_door(slow_model) -> None:
    """The same doors with limits the model's 1 s fits in: every one answers, and is counted OK."""
    with ServerProcess([str(slow_model), "--request-timeout", "5", "--invocation-timeout", "5"]) as server, \
            server.client() as http:
        before = scrape(http)
        for door, _, _, call, (_, answered) in DOORS:
            assert call(server, 5.0) == answered, door
        after = scrape(http)
        for door, protocol, route, _, (_, answered) in DOORS:
            labels = dict(protocol=protocol, route=route, model="slow", version="1", method="predict", status=answered)
            got = sample(after, "tfservo_requests_total", **labels) - sample(before, "tfservo_requests_total", **labels)
            assert got == 1, door
