"""Peers that keep failing to authenticate wait (429 with Retry-After, gRPC RESOURCE_EXHAUSTED,
botocore's ThrottlingException on the runtime API) — and no one else is slowed."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import boto3
import grpc
import httpx
import numpy as np
from botocore.config import Config
from botocore.exceptions import ClientError
from conftest import SMC, grpc_predict_request
from server_process import ServerProcess
from tensorflow_serving.apis import prediction_service_pb2_grpc

from tfservo.auth.access import Access, Throttled
from tfservo.auth.keys import KeyRing, Unauthenticated, add_key
from tfservo.auth.throttle import FailureThrottle

MODEL = SMC / "resources" / "models" / "half_plus_three"
M = "half_plus_three"


def wait_out(throttle: FailureThrottle, peer: str) -> None:
    time.sleep(throttle.held(peer) + 0.01)


def test_the_throttle_doubles_a_failing_peers_wait_to_its_cap_keeps_it_there_and_forgives_only_quiet():
    throttle = FailureThrottle(limit=3, window=1.0, penalty=0.1, max_penalty=0.4)
    for _ in range(2):
        throttle.failed("a")
    assert throttle.held("a") == 0
    throttle.failed("a")
    assert 0.05 < throttle.held("a") <= 0.1 and throttle.held("b") == 0
    assert throttle.counts() == (1, 1)
    waits = []
    for _ in range(4):
        wait_out(throttle, "a")
        throttle.failed("a")
        waits.append(throttle.held("a"))
    assert [round(w, 1) for w in waits] == [0.2, 0.4, 0.4, 0.4]  # doubled to the cap, and kept there
    time.sleep(throttle.held("a") + 1.05)  # a whole window quiet after the wait
    assert throttle.counts() == (0, 0)
    throttle.failed("a")
    assert throttle.held("a") == 0  # forgiven: counting from one again


def test_a_valid_key_between_guesses_does_not_reset_the_count():
    """The attack of issue 60: a holder of one low-privilege key sends it every few guesses.
    At a tenth of the real timings (limit 10, 6 s window, waits of 0.1 s doubling to 6 s), the
    guesser checks at most 20 wrong keys in 6 s, as the real throttle allows 20 a minute."""
    ring_file = Path(tempfile.mkdtemp()) / "keys.json"
    low = add_key(str(ring_file), "low", ["read"])
    access = Access(FailureThrottle(limit=10, window=6.0, penalty=0.1, max_penalty=6.0), KeyRing(str(ring_file)))
    checked = 0
    deadline = time.monotonic() + 6.0
    i = 0
    while time.monotonic() < deadline:
        i += 1
        token = low if i % 3 == 0 else f"tfsk_guess{i}"
        try:
            access.check_key("127.0.0.2", token, "read", "GET /v1/models")
        except Unauthenticated:
            checked += 1
        except Throttled:
            time.sleep(0.005)
    assert 10 < checked <= 20, checked
    access.close()


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
        # X-Forwarded-For is not believed: a guesser naming a new address each time is still one address
        statuses = [guesser.post(f"/v1/models/{M}:predict", json=body, headers={
            "Authorization": f"Bearer tfsk_guess{i}", "X-Forwarded-For": f"10.0.0.{i}"}).status_code
                    for i in range(12)]
        assert statuses[:10] == [401] * 10 and statuses[10:] == [429, 429]
        held = guesser.post(f"/v1/models/{M}:predict", json=body, headers={"Authorization": f"Bearer {good}"})
        assert held.status_code == 429 and int(held.headers["retry-after"]) >= 1  # not even a right key, for now
        served = honest.post(f"/v1/models/{M}:predict", json=body, headers={"Authorization": f"Bearer {good}"})
        assert served.status_code == 200  # another peer: not slowed
        time.sleep(float(held.headers["retry-after"]) + 0.2)
        assert guesser.post(f"/v1/models/{M}:predict", json=body, headers={"Authorization": f"Bearer {good}"}).status_code == 200

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

        # One throttle for every door: the signatures' failures hold this address on gRPC too.
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_target.rsplit(':', 1)[1]}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            request = grpc_predict_request(M, np.array([1.0], np.float32))
            try:
                stub.Predict(request, timeout=30, metadata=[("authorization", f"Bearer {good}")])
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        output = server.output
    assert "refused throttled peer=127.0.0.2" in output and good not in output


def test_ten_wrong_keys_over_rest_v2_and_grpc_hold_the_address_on_every_door_and_worker(tmp_path):
    """The throttle is the server's, not a door's or a worker's: with 2 workers, wrong keys
    spread over TF Serving REST, V2 REST and gRPC, each on a fresh connection, make the 11th
    request wait whatever its door and worker."""
    keys = str(tmp_path / "keys.json")
    good = add_key(keys, "svc", ["invoke"])
    scraper = add_key(keys, "scraper", ["metrics"])
    with ServerProcess([str(MODEL), "--workers", "2", "--api-keys", keys, "--host", "0.0.0.0"]) as server:
        port = server.url.rsplit(":", 1)[1]
        grpc_port = server.grpc_target.rsplit(":", 1)[1]
        v2_body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}

        def rest(token: str, v2: bool = False) -> int:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as fresh:  # a new connection each time
                if v2:
                    r = fresh.post(f"/v2/models/{M}/infer", json=v2_body, headers={"Authorization": f"Bearer {token}"})
                else:
                    r = fresh.post(f"/v1/models/{M}:predict", json={"instances": [1.0]},
                                   headers={"Authorization": f"Bearer {token}"})
                return r.status_code

        def over_grpc(token: str) -> grpc.StatusCode:
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                try:
                    stub.Predict(grpc_predict_request(M, np.array([1.0], np.float32)), timeout=30,
                                 metadata=[("authorization", f"Bearer {token}")])
                except grpc.RpcError as exc:
                    return exc.code()
                return grpc.StatusCode.OK

        answers = []
        for i in range(10):
            door = i % 3
            answers.append(rest(f"tfsk_wrong{i}") if door == 0 else rest(f"tfsk_wrong{i}", v2=True) if door == 1
                           else over_grpc(f"tfsk_wrong{i}"))
        assert answers == [401, 401, grpc.StatusCode.UNAUTHENTICATED] * 3 + [401]
        # the 11th, with the right key, on each door: held
        assert rest(good) == 429
        assert rest(good, v2=True) == 429
        assert over_grpc(good) == grpc.StatusCode.RESOURCE_EXHAUSTED
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=30) as other:
            # another address: not held
            metrics = other.get(f"http://127.0.0.2:{port}/metrics", headers={"Authorization": f"Bearer {scraper}"}).text
        assert 'tfservo_auth_throttle_peers{state="waiting"} 1.0' in metrics, metrics[-2000:]
        time.sleep(1.5)  # the first hold is 1 s (refusals while held do not lengthen it)
        assert rest(good) == 200
        # The success cleared nothing: the next wrong key, on any door, holds the address again.
        assert rest("tfsk_wrong_again") == 401 and rest(good) == 429
        output = server.output
    assert output.count("refused unauthenticated") == 11
