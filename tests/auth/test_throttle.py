"""Peers that keep failing to authenticate wait (429 with Retry-After, gRPC RESOURCE_EXHAUSTED,
botocore's ThrottlingException on the runtime API) — and no one else is slowed."""

from __future__ import annotations

import time

import boto3
import grpc
import httpx
import numpy as np
from botocore.config import Config
from botocore.exceptions import ClientError
from conftest import SMC, grpc_predict_request
from server_process import ServerProcess
from tensorflow_serving.apis import prediction_service_pb2_grpc

from tfservo.auth.keys import add_key
from tfservo.auth.throttle import FailureThrottle

MODEL = SMC / "resources" / "models" / "half_plus_three"
M = "half_plus_three"


def test_the_throttle_holds_a_failing_peer_longer_each_time_and_forgets_it_on_success():
    throttle = FailureThrottle(limit=3, window=60, penalty=0.2, max_penalty=0.8)
    for _ in range(2):
        throttle.failed("a")
    assert throttle.held("a") == 0
    throttle.failed("a")
    first = throttle.held("a")
    assert 0.1 < first <= 0.2 and throttle.held("b") == 0
    throttle.failed("a")
    assert 0.2 < throttle.held("a") <= 0.4  # doubled
    throttle.succeeded("a")
    assert throttle.held("a") == 0


def test_a_guessing_peer_is_slowed_over_rest_grpc_and_sigv4_and_no_one_else_is(tmp_path):
    keys = str(tmp_path / "keys.json")
    good = add_key(keys, "svc", ["invoke"])
    credentials = tmp_path / "credentials"
    credentials.write_text("[svc]\naws_access_key_id = AKIDTHROTTLE00000001\naws_secret_access_key = the-secret\n")
    with ServerProcess([str(MODEL), "--host", "0.0.0.0", "--api-keys", keys, "--sigv4-credentials", str(credentials)]) as server:
        port = server.url.rsplit(":", 1)[1]
        guesser = httpx.Client(base_url=f"http://127.0.0.2:{port}", transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        honest = httpx.Client(base_url=f"http://127.0.0.1:{port}")
        body = {"instances": [1.0]}
        statuses = [guesser.post(f"/v1/models/{M}:predict", json=body, headers={"Authorization": f"Bearer tfsk_guess{i}"}).status_code
                    for i in range(12)]
        assert statuses[:10] == [401] * 10 and statuses[10:] == [429, 429]
        held = guesser.post(f"/v1/models/{M}:predict", json=body, headers={"Authorization": f"Bearer {good}"})
        assert held.status_code == 429 and int(held.headers["retry-after"]) >= 1  # not even a right key, for now
        served = honest.post(f"/v1/models/{M}:predict", json=body, headers={"Authorization": f"Bearer {good}"})
        assert served.status_code == 200  # another peer: not slowed
        time.sleep(float(held.headers["retry-after"]) + 0.2)
        assert guesser.post(f"/v1/models/{M}:predict", json=body, headers={"Authorization": f"Bearer {good}"}).status_code == 200

        with grpc.insecure_channel(f"127.0.0.2:{server.grpc_target.rsplit(':', 1)[1]}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            request = grpc_predict_request(M, np.array([1.0], np.float32))
            codes = []
            for i in range(11):
                try:
                    stub.Predict(request, timeout=30, metadata=[("authorization", f"Bearer tfsk_guess{i}")])
                except grpc.RpcError as exc:
                    codes.append(exc.code())
            assert codes[:10] == [grpc.StatusCode.UNAUTHENTICATED] * 10
            assert codes[10] == grpc.StatusCode.RESOURCE_EXHAUSTED

        runtime = boto3.client("sagemaker-runtime", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                               aws_access_key_id="AKIDTHROTTLE00000001", aws_secret_access_key="wrong",
                               config=Config(retries={"max_attempts": 1}))
        errors = []
        for _ in range(11):
            try:
                runtime.invoke_endpoint(EndpointName="ep", Body=b'{"instances": [1.0]}', ContentType="application/json")
            except ClientError as exc:
                errors.append(exc.response["Error"]["Code"])
        assert errors[:10] == ["InvalidSignatureException"] * 10 and errors[10] == "ThrottlingException"
        output = server.output
    assert "refused throttled peer=127.0.0.2" in output and good not in output
