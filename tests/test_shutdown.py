"""SIGTERM on a real `tfservo serve`: no new requests, the ones in flight finish, exit 0."""

from __future__ import annotations

import json
import shutil
import signal
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from conftest import TFS
from prometheus_client.parser import text_string_to_metric_families
from server_process import ServerProcess
from tensorflow.python.data.experimental.ops import testing as tf_data_testing
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

SLEEP_SECONDS = 2.0

# A handler that is still running when SIGTERM arrives and then calls back into the server.
CALLBACK_HANDLER = f"""
    import time

    import requests


    def handler(data, context):
        body = data.read()
        time.sleep({SLEEP_SECONDS})
        response = requests.post(context.rest_uri, data=body, timeout=30)
        return response.content, "application/json"
"""


def build_slow_model(path) -> None:
    """y = 2x, after sleeping SLEEP_SECONDS inside the graph (a tf.data sleep saves with the model)."""

    class Slow(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            dataset = tf.data.Dataset.from_tensors(x).apply(tf_data_testing.sleep(int(SLEEP_SECONDS * 1e6)))
            return {"y": dataset.get_single_element() * 2.0}

    module = Slow()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("shutdown-bundle")
    build_slow_model(root / "slow" / "1")
    shutil.copytree(TFS / "saved_model_half_plus_two_cpu" / "00000123", root / "callback" / "00000123")
    (root / "callback" / "code").mkdir()
    (root / "callback" / "code" / "inference.py").write_text(textwrap.dedent(CALLBACK_HANDLER))
    return root


def in_flight(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    return {
        s.labels["protocol"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tfservo_requests_in_flight"
    }


def test_sigterm_finishes_requests_in_flight_and_exits_0(bundle):
    proc = ServerProcess([str(bundle)]).start()
    client = proc.client()
    channel = grpc.insecure_channel(proc.grpc_target)
    try:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        grpc_request = predict_pb2.PredictRequest()
        grpc_request.model_spec.name = "slow"
        grpc_request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1.0, 2.0], np.float32)))

        def rest_slow():
            with proc.client() as own:
                return own.post("/v1/models/slow:predict", content=b'{"instances": [3.0]}')

        def invocation():
            with proc.client() as own:
                return own.post(
                    "/invocations",
                    content=b'{"instances": [[4.0]]}',
                    headers={"Content-Type": "application/json",
                             "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=callback"},
                )

        with ThreadPoolExecutor(3) as pool:
            rest_future = pool.submit(rest_slow)
            grpc_future = pool.submit(lambda: stub.Predict(grpc_request, timeout=60))
            invocation_future = pool.submit(invocation)
            deadline = time.monotonic() + 20
            # Three requests in flight (the scrape itself is the fourth HTTP one).
            while (counts := in_flight(client)).get("http", 0) < 3 or counts.get("grpc", 0) < 1:
                assert time.monotonic() < deadline, f"requests never got in flight: {counts}"
                time.sleep(0.05)

            proc.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            try:  # no new work: refused while draining, or the socket is already closed
                late = client.post("/invocations", content=b"[1.0]", headers={"Content-Type": "application/json"})
                assert late.status_code == 503, late.text
                assert "shutting down" in late.json()["error"]
            except httpx.TransportError:
                pass

            rest_response = rest_future.result(timeout=60)
            grpc_response = grpc_future.result(timeout=60)
            invocation_response = invocation_future.result(timeout=60)

        assert rest_response.status_code == 200 and rest_response.json() == {"predictions": [6.0]}
        assert tf.make_ndarray(grpc_response.outputs["y"]).tolist() == [2.0, 4.0]
        # The handler's call back into the REST API, made after SIGTERM, was still answered.
        assert invocation_response.status_code == 200, invocation_response.text
        assert json.loads(invocation_response.content) == {"predictions": [[4.0]]}

        assert proc.proc.wait(timeout=60) == 0, proc.output
        deadline = time.monotonic() + 5  # the last lines may still be on their way through the pipe
        while "stopped" not in proc.output and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "SIGTERM received" in proc.output and "stopped" in proc.output
        with pytest.raises(httpx.TransportError):
            client.get("/ping")
    finally:
        proc.stop(signal.SIGKILL)
        client.close()
        channel.close()
