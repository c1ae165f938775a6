"""SageMaker Asynchronous Inference against a real `tfservo serve --async-inference-config`, with
moto's S3, SNS and SQS on loopback: boto3's invoke_endpoint_async and the AWS CLI's
invoke-endpoint-async; answers in S3 byte-equal to /invocations'; failures in the failure
location; SNS notifications in SageMaker's format read through an SQS subscription; a backlog
killed -9 and restarted runs every request once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import httpx
import pytest
from clusters import image_example
from conftest import SMC, write_code
from http_receiver import start_receiver
from s3_server import REGION
from server_process import ServerProcess

MODEL = str(SMC / "resources" / "models" / "half_plus_three")
AWS_CLI = str(Path(sys.executable).with_name("aws"))


def client(service: str, endpoint: str):
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def wait_for(check, timeout: float = 60.0, what: str = "it"):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.2)


def s3_object(s3, bucket: str, key: str) -> bytes | None:
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


@pytest.fixture(scope="module")
def aws(s3_endpoint):
    """A bucket, success and error topics, and an SQS queue subscribed to both."""
    s3, sns, sqs = client("s3", s3_endpoint), client("sns", s3_endpoint), client("sqs", s3_endpoint)
    bucket = f"async-{os.getpid()}"
    s3.create_bucket(Bucket=bucket)
    topics = {kind: sns.create_topic(Name=f"async-{kind}-{os.getpid()}")["TopicArn"] for kind in ("ok", "error")}
    queue_url = sqs.create_queue(QueueName=f"async-notes-{os.getpid()}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for arn in topics.values():
        sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})
    return {"endpoint": s3_endpoint, "s3": s3, "sqs": sqs, "bucket": bucket, "topics": topics, "queue": queue_url}


def notes(aws, count: int) -> list[dict]:
    """`count` notifications from the queue (SageMaker's JSON messages)."""
    got: list[dict] = []

    def more():
        answer = aws["sqs"].receive_message(QueueUrl=aws["queue"], MaxNumberOfMessages=10, WaitTimeSeconds=1)
        for message in answer.get("Messages", []):
            got.append(json.loads(message["Body"]))
            aws["sqs"].delete_message(QueueUrl=aws["queue"], ReceiptHandle=message["ReceiptHandle"])
        return len(got) >= count

    wait_for(more, what=f"{count} notifications")
    return got


@pytest.fixture(scope="module")
def served(aws, tmp_path_factory):
    work = tmp_path_factory.mktemp("async")
    config = work / "async.json"
    config.write_text(json.dumps({
        "OutputConfig": {
            "S3OutputPath": f"s3://{aws['bucket']}/out/",
            "S3FailurePath": f"s3://{aws['bucket']}/failures",
            "NotificationConfig": {"SuccessTopic": aws["topics"]["ok"], "ErrorTopic": aws["topics"]["error"],
                                   "IncludeInferenceResponseIn": ["SUCCESS_NOTIFICATION_TOPIC"]},
        },
        "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 2},
    }))
    images = image_example().build_model(str(work / "images"))  # image_stats and its JPEG handler
    with ServerProcess([MODEL, images, "--async-inference-config", str(config), "--async-state", str(work / "state"),
                        "--endpoint-name", "my-endpoint"]) as server:
        server.work = work
        yield server


def test_boto3_and_the_aws_cli_queue_requests_whose_answers_match_invocations(aws, served):
    s3, bucket = aws["s3"], aws["bucket"]
    s3.put_object(Bucket=bucket, Key="in/rows.csv", Body=b"1.0\n2.0\n5.0\n")
    s3.put_object(Bucket=bucket, Key="in/request.json", Body=b'{"instances": [1.0, 2.0]}')
    runtime = client("sagemaker-runtime", served.url)
    queued = runtime.invoke_endpoint_async(EndpointName="my-endpoint", InputLocation=f"s3://{bucket}/in/rows.csv",
                                           ContentType="text/csv", InferenceId="csv-1")
    assert queued["ResponseMetadata"]["HTTPStatusCode"] == 202 and queued["InferenceId"] == "csv-1"
    assert queued["OutputLocation"] == f"s3://{bucket}/out/csv-1.out"
    assert queued["FailureLocation"] == f"s3://{bucket}/failures/csv-1-error.out"
    done = subprocess.run(
        [AWS_CLI, "sagemaker-runtime", "invoke-endpoint-async", "--endpoint-url", served.url, "--endpoint-name",
         "my-endpoint", "--input-location", f"s3://{bucket}/in/request.json", "--content-type", "application/json",
         "--inference-id", "json-1"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_DEFAULT_REGION": REGION},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["OutputLocation"] == f"s3://{bucket}/out/json-1.out"
    with httpx.Client(base_url=served.url, timeout=60) as http:
        for key, body, content_type in (("csv-1", b"1.0\n2.0\n5.0\n", "text/csv"),
                                        ("json-1", b'{"instances": [1.0, 2.0]}', "application/json")):
            answer = wait_for(lambda key=key: s3_object(s3, bucket, f"out/{key}.out"), what=key)
            sync = http.post("/invocations", content=body, headers={"Content-Type": content_type})
            assert answer == sync.content  # byte for byte what /invocations answers
            state = http.get(f"/async-invocations/{key}").json()
            assert state["State"] == "completed" and state["Attempts"] == 1
    # a JPEG through the image bundle's handler (which posts it to context.rest_uri itself)
    image_example().write_images(str(served.work / "jpegs"), [("red.jpg", (250, 10, 10))])
    s3.put_object(Bucket=bucket, Key="in/red.jpg", Body=(served.work / "jpegs" / "red.jpg").read_bytes())
    runtime.invoke_endpoint_async(EndpointName="my-endpoint", InputLocation=f"s3://{bucket}/in/red.jpg",
                                  ContentType="application/x-image", InferenceId="jpeg-1",
                                  CustomAttributes="tfs-model-name=image_stats")
    answer = json.loads(wait_for(lambda: s3_object(s3, bucket, "out/jpeg-1.out"), what="the JPEG's answer"))
    assert answer["predictions"][0]["mean_rgb"][0] > 200 and answer["predictions"][0]["mean_rgb"][1] < 50
    messages = {m["inferenceId"]: m for m in notes(aws, 3)}
    ok = messages["csv-1"]
    assert ok["invocationStatus"] == "Completed" and ok["eventName"] == "InferenceResult"
    assert ok["eventSource"] == "aws:sagemaker" and ok["awsRegion"] == REGION
    assert ok["requestParameters"] == {"contentType": "text/csv", "endpointName": "my-endpoint",
                                       "inputLocation": f"s3://{bucket}/in/rows.csv"}
    assert ok["responseParameters"]["outputLocation"] == f"s3://{bucket}/out/csv-1.out"
    assert json.loads(ok["responseBody"]["content"]) == {"predictions": [3.5, 4.0, 5.5]}


def test_a_bad_input_lands_in_the_failure_location_and_the_error_topic(aws, served):
    s3, bucket = aws["s3"], aws["bucket"]
    s3.put_object(Bucket=bucket, Key="in/bad.json", Body=b'{"instances": [1.0,')
    runtime = client("sagemaker-runtime", served.url)
    runtime.invoke_endpoint_async(EndpointName="my-endpoint", InputLocation=f"s3://{bucket}/in/bad.json",
                                  ContentType="application/json", InferenceId="bad-1")
    runtime.invoke_endpoint_async(EndpointName="my-endpoint", InputLocation=f"s3://{bucket}/in/missing.json",
                                  ContentType="application/json", InferenceId="missing-1")
    error = wait_for(lambda: s3_object(s3, bucket, "failures/bad-1-error.out"), what="the failure object")
    assert b"not valid JSON" in error  # what /invocations would have answered
    wait_for(lambda: s3_object(s3, bucket, "failures/missing-1-error.out"), what="the missing input's failure")
    assert s3_object(s3, bucket, "out/bad-1.out") is None
    messages = {m["inferenceId"]: m for m in notes(aws, 2)}
    assert messages["bad-1"]["invocationStatus"] == "Failed"
    assert "Received client error (400)" in messages["bad-1"]["failureReason"]
    assert messages["bad-1"]["responseParameters"]["failureLocation"] == f"s3://{bucket}/failures/bad-1-error.out"
    assert "cannot read the input" in messages["missing-1"]["failureReason"]
    # refused at once, in the runtime API's shapes
    with pytest.raises(runtime.exceptions.ValidationError, match="InputLocation is required"):
        runtime.invoke_endpoint_async(EndpointName="my-endpoint", ContentType="application/json")
    with pytest.raises(runtime.exceptions.ValidationError, match="--async-input-root"):
        runtime.invoke_endpoint_async(EndpointName="my-endpoint", InputLocation="file:///etc/passwd")
    with pytest.raises(runtime.exceptions.ValidationError, match="already queued for input"):
        runtime.invoke_endpoint_async(EndpointName="my-endpoint", InputLocation=f"s3://{bucket}/in/other.json",
                                      InferenceId="bad-1")
    metrics = httpx.get(f"{served.url}/metrics").text
    assert 'tfservo_async_requests_total{outcome="failed"} 2.0' in metrics
    assert "tfservo_async_backlog 0.0" in metrics


def test_a_backlog_killed_mid_way_runs_every_request_once_after_a_restart(tmp_path):
    """200 requests queued, the server killed -9 while it works through them, started again on
    the same state folder: 200 answers, none missing, none twice, a notification for each."""
    inputs, out = tmp_path / "inputs", tmp_path / "out"
    inputs.mkdir()
    seen: list[str] = []
    lock = threading.Lock()

    def on_post(path, headers, body):
        with lock:
            seen.append(json.loads(body)["inferenceId"])
        return 200

    receiver, hook = start_receiver(on_post)
    config = tmp_path / "async.json"
    config.write_text(json.dumps({"OutputConfig": {"S3OutputPath": str(out), "NotificationConfig": {
        "SuccessTopic": hook + "done", "ErrorTopic": hook + "failed"}},
        "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 1}}))
    args = [MODEL, "--async-inference-config", str(config), "--async-state", str(tmp_path / "state"),
            "--async-input-root", str(inputs)]
    try:
        with ServerProcess(args) as first, httpx.Client(base_url=first.url, timeout=60) as http:
            for i in range(200):
                (inputs / f"{i}.csv").write_text(f"{i}.0\n")
                queued = http.post("/endpoints/ep/async-invocations", headers={
                    "X-Amzn-SageMaker-InputLocation": str(inputs / f"{i}.csv"),
                    "X-Amzn-SageMaker-Content-Type": "text/csv", "X-Amzn-SageMaker-Inference-Id": f"r{i}"})
                assert queued.status_code == 202, queued.text
            wait_for(lambda: len(list(out.glob("*.out"))) >= 20, what="the first answers")
            os.kill(first.proc.pid, signal.SIGKILL)
            first.proc.wait()
        partway = len(list(out.glob("*.out")))
        assert partway < 200, "the backlog finished before the kill; nothing was tested"
        with ServerProcess(args) as second:
            wait_for(lambda: len(list(out.glob("*.out"))) == 200, timeout=240, what="all 200 answers")
            states = httpx.get(f"{second.url}/async-invocations/r199").json()
        assert states["State"] == "completed"
        assert sorted(p.name for p in out.iterdir()) == sorted(f"r{i}.out" for i in range(200))  # no temp files
        for i in (0, 57, 199):
            assert json.loads((out / f"r{i}.out").read_text()) == {"predictions": [0.5 * i + 3.0]}
        wait_for(lambda: set(seen) >= {f"r{i}" for i in range(200)}, what="a notification for each")
    finally:
        receiver.shutdown()


# Records when each call starts and ends (in whichever worker runs it), then answers the model's.
TIMED_HANDLER = """
    import fcntl, json, os, time

    import requests


    def note(what):
        with open(os.environ["ASYNC_TIMES"], "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(f"{what} {time.time()}\\n")


    def handler(data, context):
        note("start")
        time.sleep(0.3)
        answer = requests.post(context.rest_uri, data=data.read(), headers={"Content-Type": "text/csv"}, timeout=30)
        note("end")
        return answer.text, "application/json"
"""


def test_workers_share_one_queue_and_its_cap_on_requests_running_at_once(tmp_path):
    """Two workers, MaxConcurrentInvocationsPerInstance 1: the handler never runs twice at once."""
    from conftest import handler_bundle

    bundle = handler_bundle(tmp_path / "bundle", TIMED_HANDLER)
    times, out, inputs = tmp_path / "times.txt", tmp_path / "out", tmp_path / "inputs"
    inputs.mkdir()
    config = tmp_path / "async.json"
    config.write_text(json.dumps({"OutputConfig": {"S3OutputPath": str(out)},
                                  "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 1}}))
    with ServerProcess([str(bundle), "--workers", "2", "--async-inference-config", str(config), "--async-state",
                        str(tmp_path / "state"), "--async-input-root", str(inputs)],
                       env={"ASYNC_TIMES": str(times)}) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        for i in range(8):
            (inputs / f"{i}.csv").write_text(f"{i}.0\n")
            http.post("/endpoints/ep/async-invocations", headers={
                "X-Amzn-SageMaker-InputLocation": str(inputs / f"{i}.csv"), "X-Amzn-SageMaker-Content-Type": "text/csv"})
        in_flight: list[float] = []

        def drained() -> bool:  # the backlog watched as an operator would: through /metrics
            for line in http.get("/metrics").text.splitlines():
                if line.startswith("tfservo_async_in_flight "):
                    in_flight.append(float(line.split()[1]))
            return len(list(out.glob("*.out"))) == 8

        wait_for(drained, what="8 answers")
    assert max(in_flight) == 1.0  # seen running, never more than the cap
    events = sorted((float(t), kind) for kind, t in (line.split() for line in times.read_text().splitlines()))
    running = peak = 0
    for _, kind in events:
        running += 1 if kind == "start" else -1
        peak = max(peak, running)
    assert peak == 1 and len(events) == 16


def test_requests_accepted_before_the_output_disk_filled_all_end_once_space_returns(tmp_path):
    """Answers that cannot be written (a full disk) keep their request queued, not failed: once
    space returns every accepted request ends with its answer, and no temporary file is left."""
    from small_disk import resize, small_disk

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    with small_disk(tmp_path / "disk", "64k") as out:
        config = tmp_path / "async.json"
        config.write_text(json.dumps({"OutputConfig": {"S3OutputPath": str(out)},
                                      "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 2}}))
        args = [MODEL, "--async-inference-config", str(config), "--async-state", str(tmp_path / "state"),
                "--async-input-root", str(inputs)]
        with ServerProcess(args) as server, httpx.Client(base_url=server.url, timeout=60) as http:
            for i in range(40):
                (inputs / f"{i}.csv").write_text(f"{i}.0\n")
                queued = http.post("/endpoints/ep/async-invocations", headers={
                    "X-Amzn-SageMaker-InputLocation": str(inputs / f"{i}.csv"),
                    "X-Amzn-SageMaker-Content-Type": "text/csv", "X-Amzn-SageMaker-Inference-Id": f"r{i}"})
                assert queued.status_code == 202, queued.text
            server.wait_for("kept queued: cannot write the answer", timeout=60)
            assert len(list(out.glob("*.out"))) < 40
            states = [http.get(f"/async-invocations/r{i}").json()["State"] for i in range(40)]
            assert "failed" not in states, states
            resize(out, "8m")
            wait_for(lambda: len(list(out.glob("*.out"))) == 40, timeout=120, what="all 40 answers")
            wait_for(lambda: all(http.get(f"/async-invocations/r{i}").json()["State"] == "completed"
                                 for i in range(40)), what="every request completed")
        assert sorted(p.name for p in out.iterdir()) == sorted(f"r{i}.out" for i in range(40))  # no temp files
        assert json.loads((out / "r7.out").read_text()) == {"predictions": [6.5]}


def test_an_inference_pipeline_queues_and_answers_as_its_invocations(aws, tmp_path):
    """A pipeline (a code-only CSV-to-JSON container, then the model) behind the async queue: the
    answer in S3 is /invocations' bytes; a container's failure lands in the failure location."""
    write_code(tmp_path / "to_json" / "code", """
        import json

        def handler(data, context):
            return json.dumps({"instances": [float(v) for v in data.read().decode().split()]}), "application/json"
    """)
    config = tmp_path / "async.json"
    config.write_text(json.dumps({"OutputConfig": {"S3OutputPath": f"s3://{aws['bucket']}/pipeline-out/",
                                                   "S3FailurePath": f"s3://{aws['bucket']}/pipeline-failures"}}))
    s3, bucket = aws["s3"], aws["bucket"]
    s3.put_object(Bucket=bucket, Key="pipeline/rows.csv", Body=b"1 2 5")
    s3.put_object(Bucket=bucket, Key="pipeline/bad.csv", Body=b"1 x")
    with ServerProcess([str(tmp_path / "to_json"), MODEL, "--pipeline", "--async-inference-config", str(config),
                        "--async-state", str(tmp_path / "state"), "--endpoint-name", "piped"]) as server:
        runtime = client("sagemaker-runtime", server.url)
        for key in ("rows", "bad"):
            runtime.invoke_endpoint_async(EndpointName="piped", InputLocation=f"s3://{bucket}/pipeline/{key}.csv",
                                          ContentType="text/csv", InferenceId=f"pipe-{key}")
        answer = wait_for(lambda: s3_object(s3, bucket, "pipeline-out/pipe-rows.out"), what="the pipeline's answer")
        with httpx.Client(base_url=server.url, timeout=60) as http:
            sync = http.post("/invocations", content=b"1 2 5", headers={"Content-Type": "text/csv"})
        assert answer == sync.content and json.loads(answer) == {"predictions": [3.5, 4.0, 5.5]}
        failure = wait_for(lambda: s3_object(s3, bucket, "pipeline-failures/pipe-bad-error.out"),
                           what="the failing container's error")
        assert b"could not convert string to float" in failure
