"""SageMaker's runtime API on `tfservo serve`: boto3's `sagemaker-runtime` client and the AWS CLI,
unchanged, against POST /endpoints/{name}/invocations — the SDK guide's request forms, the
answer headers, and the error shapes botocore raises (ModelError, ValidationError)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from conftest import SMC, write_code
from server_process import ServerProcess

ANY_KEYS = {"aws_access_key_id": "anything", "aws_secret_access_key": "at-all", "region_name": "eu-west-1"}
AWS = str(Path(sys.executable).with_name("aws"))


def runtime(url: str):
    return boto3.client("sagemaker-runtime", endpoint_url=url, config=Config(retries={"max_attempts": 1}), **ANY_KEYS)


@pytest.fixture(scope="module")
def client(tfs_server):
    return runtime(tfs_server.url)


def invoke(client, body, **kw):
    answer = client.invoke_endpoint(EndpointName="my-endpoint", Body=body, **kw)
    return answer, answer["Body"].read()


def test_boto3_json_answers_with_the_variant(client):
    answer, body = invoke(client, json.dumps({"instances": [1.0, 2.0, 5.0]}), ContentType="application/json")
    assert json.loads(body) == {"predictions": [3.5, 4.0, 5.5]}  # half_plus_three, the default model
    assert answer["ContentType"] == "application/json"
    assert answer["InvokedProductionVariant"] == "AllTraffic"
    assert "CustomAttributes" not in answer


def test_boto3_the_sdk_guides_request_forms(client):
    # TF Serving JSON naming a model and a method in custom attributes (the guide's regress example)
    _, body = invoke(
        client,
        json.dumps({"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}, {"x": 2.0}]}),
        ContentType="application/json",
        CustomAttributes="tfs-model-name=saved_model_half_plus_two_2_versions,tfs-method=regress",
    )
    assert json.loads(body) == {"results": [2.5, 3.0]}
    # simplified JSON, CSV, JSON lines
    _, body = invoke(client, "[1.0, 2.0]", ContentType="application/json")  # one instance, as the container reads it
    assert json.loads(body) == {"predictions": [[3.5, 4.0]]}
    _, body = invoke(client, "1.0\n2.0\n", ContentType="text/csv")
    assert json.loads(body) == {"predictions": [3.5, 4.0]}
    _, body = invoke(client, b"[1.0]\n[2.0]\n", ContentType="application/jsonlines", Accept="application/jsonlines")
    assert body == b'{    "predictions": [[3.5], [4.0]    ]}'  # the container's one line
    # every header SageMaker's API defines is accepted
    answer, _ = invoke(
        client, "[1.0]", ContentType="application/json", TargetVariant="AllTraffic", InferenceId="req-0001",
    )
    assert answer["InvokedProductionVariant"] == "AllTraffic"


def test_a_model_error_is_botocores_model_error_with_the_original_status(client):
    with pytest.raises(client.exceptions.ModelError) as caught:
        invoke(client, b'{"instances": [1.0,', ContentType="application/json")
    error = caught.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert error["OriginalStatusCode"] == 400
    assert "JSON" in error["OriginalMessage"] or "json" in error["OriginalMessage"]
    assert "Received client error (400)" in error["Error"]["Message"]
    with pytest.raises(client.exceptions.ModelError) as caught:  # a method the model lacks
        invoke(client, b"[1.0]", ContentType="application/json", CustomAttributes="tfs-method=classify")
    assert caught.value.response["OriginalStatusCode"] == 400
    with pytest.raises(client.exceptions.ModelError) as caught:
        invoke(client, b"\x89PNG", ContentType="image/png")
    assert caught.value.response["OriginalStatusCode"] == 415


@pytest.mark.parametrize(
    ("name", "headers", "says"),
    [
        ("bad_name", {}, "endpointName"),
        ("-leading-dash", {}, "endpointName"),
        ("e" * 64, {}, "endpointName"),
        ("my-endpoint", {"TargetVariant": "Canary"}, "variant Canary"),
        ("my-endpoint", {"InferenceId": "x" * 65}, "inferenceId"),
        ("my-endpoint", {"TargetModel": "a/model.tar.gz"}, "not a multi-model endpoint"),
    ],
)
def test_requests_sagemaker_would_refuse_are_validation_errors(client, name, headers, says):
    with pytest.raises(client.exceptions.ValidationError, match=says):
        client.invoke_endpoint(EndpointName=name, Body=b"[1.0]", ContentType="application/json", **headers)


def test_the_aws_cli_invokes_and_reports_model_errors(tfs_server, tmp_path):
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-west-2"}
    body = tmp_path / "input.jsonl"
    body.write_text('{"instances": [1.0, 2.0]}')
    out = tmp_path / "out.json"
    base = [AWS, "sagemaker-runtime", "invoke-endpoint", "--endpoint-url", tfs_server.url, "--endpoint-name", "ep"]
    done = subprocess.run(
        [*base, "--body", f"fileb://{body}", "--content-type", "application/json",
         "--custom-attributes", "tfs-model-name=half_plus_three", str(out)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == {"predictions": [3.5, 4.0]}
    assert json.loads(done.stdout)["InvokedProductionVariant"] == "AllTraffic"
    body.write_text("not json")
    failed = subprocess.run(
        [*base, "--body", f"fileb://{body}", "--content-type", "application/json", str(out)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert failed.returncode != 0
    assert "ModelError" in failed.stderr and "Received client error (400)" in failed.stderr


def test_endpoint_name_is_checked_when_the_server_has_one(tmp_path):
    code = write_code(
        tmp_path / "bundle" / "code",
        """
        import json

        def handler(data, context):
            rows = json.loads(data.read().decode())
            return json.dumps({"n": len(rows)}), "application/json", "rows=%d" % len(rows)
        """,
    )
    shutil.copytree(SMC / "resources" / "models" / "half_plus_three", code.parent / "half_plus_three")
    server = ServerProcess([str(code.parent), "--endpoint-name", "prod-1", "--variant-name", "blue"]).start()
    try:
        client = runtime(server.url)
        answer = client.invoke_endpoint(EndpointName="prod-1", Body=b"[1, 2, 3]", ContentType="application/json")
        assert json.loads(answer["Body"].read()) == {"n": 3}
        assert answer["CustomAttributes"] == "rows=3"  # the handler's, passed back
        assert answer["InvokedProductionVariant"] == "blue"
        with pytest.raises(client.exceptions.ValidationError, match="Endpoint prod-2 not found"):
            client.invoke_endpoint(EndpointName="prod-2", Body=b"[1]", ContentType="application/json")
        # the container route passes a handler's custom attributes back as well
        with server.client() as http:
            got = http.post("/invocations", content=b"[1]", headers={"content-type": "application/json"})
        assert got.headers["x-amzn-sagemaker-custom-attributes"] == "rows=1"
    finally:
        server.stop()

