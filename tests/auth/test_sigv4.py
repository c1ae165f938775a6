"""SigV4 on SageMaker's runtime API with real clients nobody here wrote: boto3, the AWS CLI and
the SageMaker SDK's Predictor sign with the right keys and are served; a wrong secret, an unknown
key, a request signed 10 minutes ago and a body altered after signing each raise the botocore
error AWS would give; keys rotate without a restart; no secret or signature reaches the log."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import boto3
import botocore.auth
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from conftest import SMC
from server_process import ServerProcess

MODEL = SMC / "resources" / "models" / "half_plus_three"
AWS = str(Path(sys.executable).with_name("aws"))
KEY, SECRET = "AKIDTFSERVOTEST00001", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYTESTKEY"
SDK_KEY, SDK_SECRET = "testing", "testing"  # what the moto fixture puts in the environment
BODY = b'{"instances": [1.0, 2.0]}'


def credentials(path: Path, *keys: tuple[str, str, str]) -> Path:
    path.write_text("".join(f"[{name}]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n\n"
                            for name, key, secret in keys))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    keys = credentials(tmp_path_factory.mktemp("sigv4") / "credentials", ("team-a", KEY, SECRET),
                       ("sdk", SDK_KEY, SDK_SECRET))
    # the module's refused signatures, all from 127.0.0.1, stay counted (test_throttle.py checks the waits)
    with ServerProcess([str(MODEL), "--sigv4-credentials", str(keys), "--auth-failure-limit", "1000"]) as server:
        yield server, keys


def runtime(url: str, key: str = KEY, secret: str = SECRET):
    return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="eu-west-1",
                        aws_access_key_id=key, aws_secret_access_key=secret, config=Config(retries={"max_attempts": 1}))


def invoke(client):
    return client.invoke_endpoint(EndpointName="ep", Body=BODY, ContentType="application/json")


def error_of(call) -> tuple[str, str]:
    with pytest.raises(ClientError) as caught:
        call()
    return caught.value.response["Error"]["Code"], caught.value.response["Error"]["Message"]


def test_boto3_with_the_right_key_is_served(server):
    url = server[0].url
    answer = invoke(runtime(url))
    assert json.loads(answer["Body"].read()) == {"predictions": [3.5, 4.0]}


def test_wrong_secret_unknown_key_stale_date_and_altered_body_are_refused_as_aws_does(server):
    url = server[0].url
    code, message = error_of(lambda: invoke(runtime(url, secret="not-the-secret")))
    assert code == "InvalidSignatureException" and "signature we calculated does not match" in message
    code, message = error_of(lambda: invoke(runtime(url, key="AKIDUNKNOWN000000000")))
    assert (code, message) == ("UnrecognizedClientException", "The security token included in the request is invalid.")

    ten_minutes_ago = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) - datetime.timedelta(minutes=10)
    with mock.patch.object(botocore.auth, "get_current_datetime", lambda: ten_minutes_ago):  # the client's clock
        code, message = error_of(lambda: invoke(runtime(url)))
    assert code == "InvalidSignatureException" and message.startswith("Signature expired: ")

    client = runtime(url)

    def alter(request, **_):
        request.body = b'{"instances": [9.0, 9.0]}'  # after signing, before sending

    client.meta.events.register("before-send.sagemaker-runtime.InvokeEndpoint", alter)
    code, _ = error_of(lambda: invoke(client))
    assert code == "InvalidSignatureException"


def test_unsigned_and_malformed_requests_get_4xx_in_aws_shape(server):
    url = server[0].url + "/endpoints/ep/invocations"
    bare = httpx.post(url, content=BODY, headers={"Content-Type": "application/json"})
    assert bare.status_code == 403 and bare.headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"
    for authorization in ("Bearer abc", "AWS4-HMAC-SHA256 Credential=x", "AWS4-HMAC-SHA256 " + "A" * 7000,
                          "AWS4-HMAC-SHA256 Credential=ké/2026/r/s/aws4_request, SignedHeaders=host, Signature=" + "0" * 64):
        answer = httpx.post(url, content=BODY, headers={"Authorization": authorization.encode("utf-8")})
        assert 400 <= answer.status_code < 500, (authorization[:40], answer.status_code)
        assert answer.headers["content-type"].startswith("application/json") and "message" in answer.json()
    # past the header line limit the protocol answers first, before any door reads the request
    huge = httpx.post(url, content=BODY, headers={"Authorization": "AWS4-HMAC-SHA256 " + "A" * 20000})
    assert huge.status_code == 431 and "Request headers too large" in huge.json()["error"]


def test_the_aws_cli_and_the_sdk_predictor_sign_with_their_keys(server, tmp_path, s3_endpoint):
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.predictor import Predictor
    from sagemaker.serializers import JSONSerializer

    from tfservo.sagemaker_sdk import Session

    url = server[0].url
    (tmp_path / "in.json").write_bytes(BODY)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-west-2"}
    command = [AWS, "sagemaker-runtime", "invoke-endpoint", "--endpoint-url", url, "--endpoint-name", "ep",
               "--body", f"fileb://{tmp_path / 'in.json'}", "--content-type", "application/json", str(tmp_path / "out.json")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out.json").read_text()) == {"predictions": [3.5, 4.0]}
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120,
                             env={**env, "AWS_SECRET_ACCESS_KEY": "wrong"})
    assert refused.returncode != 0 and "InvalidSignatureException" in refused.stderr

    session = Session(endpoint_url=url)  # signs with the environment's keys (the moto fixture's)
    try:
        predictor = Predictor("ep", sagemaker_session=session, serializer=JSONSerializer(), deserializer=JSONDeserializer())
        assert predictor.predict({"instances": [1.0]}) == {"predictions": [3.5]}
    finally:
        session.close()


def test_keys_rotate_without_a_restart_and_never_reach_the_log(server):
    process, keys = server
    url = process.url
    new_key, new_secret = "AKIDTFSERVOROTATED01", "rotated-secret-value-000000000000000000"
    original = keys.read_text()
    try:
        credentials(keys, ("team-a", new_key, new_secret), ("sdk", SDK_KEY, SDK_SECRET))
        os.utime(keys, (time.time() + 5, time.time() + 5))  # a new modification time, whatever the clock's grain
        deadline = time.monotonic() + 10
        while True:
            try:
                invoke(runtime(url, new_key, new_secret))
                break
            except ClientError:
                assert time.monotonic() < deadline, "the new key was never accepted"
                time.sleep(0.3)
        assert error_of(lambda: invoke(runtime(url)))[0] == "UnrecognizedClientException"  # the old key
    finally:
        keys.write_text(original)
        os.utime(keys, (time.time() + 10, time.time() + 10))
    output = process.output
    assert "refused sigv4" in output and f"key={KEY}" in output  # the audit line names the key id
    for secret in (SECRET, new_secret, "Signature="):
        assert secret not in output


def signed_headers(url: str, body: bytes, payload_hash: str) -> dict[str, str]:
    """Headers botocore's own signer makes for `body` with `x-amz-content-sha256: payload_hash`
    among the signed headers (as a proxy log would show them)."""
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method="POST", url=url, data=body,
                         headers={"Content-Type": "application/json", "x-amz-content-sha256": payload_hash})
    # the key no other test rotates
    botocore.auth.SigV4Auth(Credentials(SDK_KEY, SDK_SECRET), "sagemaker", "eu-west-1").add_auth(request)
    return dict(request.headers.items())


def test_a_signed_payload_hash_binds_the_body_and_unsigned_payloads_are_refused(server):
    """A signature over `x-amz-content-sha256` cannot carry another body, and a request signed
    with UNSIGNED-PAYLOAD (or a streaming payload) is refused whatever its body."""
    import hashlib

    url = server[0].url + "/endpoints/ep/invocations"
    honest = signed_headers(url, BODY, hashlib.sha256(BODY).hexdigest())
    answer = httpx.post(url, content=BODY, headers=honest)
    assert answer.status_code == 200 and answer.json() == {"predictions": [3.5, 4.0]}
    swapped = httpx.post(url, content=b'{"instances": [100.0]}', headers=honest)
    assert swapped.status_code == 400, swapped.text
    assert swapped.headers["x-amzn-ErrorType"] == "InvalidSignatureException"
    assert "does not match what was computed" in swapped.json()["message"]
    for declared in ("UNSIGNED-PAYLOAD", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"):
        unsigned = httpx.post(url, content=b'{"instances": [100.0]}', headers=signed_headers(url, BODY, declared))
        assert unsigned.status_code == 400, (declared, unsigned.text)
        assert unsigned.headers["x-amzn-ErrorType"] == "InvalidSignatureException"
        assert "needs the body signed" in unsigned.json()["message"]


def test_the_replay_window_refuses_a_signature_seen_before_on_any_worker(tmp_path):
    """Without it a captured request may be sent again for 5 minutes, as on AWS; with
    --sigv4-replay-window each signature is taken once, whichever worker sees it."""
    import hashlib

    keys = credentials(tmp_path / "credentials", ("sdk", SDK_KEY, SDK_SECRET))
    args = [str(MODEL), "--sigv4-credentials", str(keys), "--sigv4-replay-window", "300", "--workers", "2"]
    with ServerProcess(args) as server:
        url = server.url + "/endpoints/ep/invocations"
        headers = signed_headers(url, BODY, hashlib.sha256(BODY).hexdigest())
        assert httpx.post(url, content=BODY, headers=headers).status_code == 200
        for _ in range(4):  # fresh connections: both workers see the replay
            with httpx.Client() as fresh:
                again = fresh.post(url, content=BODY, headers=headers)
            assert again.status_code == 403 and "already received" in again.json()["message"], again.text
        assert invoke(runtime(server.url, SDK_KEY, SDK_SECRET))["ResponseMetadata"]["HTTPStatusCode"] == 200
    with ServerProcess([str(MODEL), "--sigv4-credentials", str(keys)]) as server:  # off by default: as AWS
        url = server.url + "/endpoints/ep/invocations"
        headers = signed_headers(url, BODY, hashlib.sha256(BODY).hexdigest())
        assert [httpx.post(url, content=BODY, headers=headers).status_code for _ in range(2)] == [200, 200]
