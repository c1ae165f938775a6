"""SageMaker Data Capture on a real `tfservo serve`: clients nobody here wrote (boto3's
invoke_endpoint with InferenceId, the SageMaker SDK's DataCaptureConfig) against real servers,
capture to a local folder and to moto's S3, every line parsed and matched to what was sent
and answered."""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time
from pathlib import Path

import boto3
import httpx
import pytest
from conftest import handler_bundle
from s3_server import s3_bucket, s3_client, s3_endpoint  # noqa: F401
from server_process import ServerProcess

IMAGE = bytes(range(256)) * 4  # not UTF-8: captured as BASE64

HANDLER = """
    import json

    def handler(data, context):
        if context.request_content_type == "application/x-image":
            return json.dumps({"predictions": [len(data.read())]}), "application/json"
        if context.request_content_type == "text/csv":
            values = [float(v) for v in data.read().decode().split(",")]
            return ",".join(str(v + 3) for v in values), "text/csv"
        doc = json.loads(data.read())
        return json.dumps({"predictions": [x / 2 + 3 for x in doc["instances"]]}), "application/json"
"""


def capture_config(path: Path, destination: str, percent: float = 100, **extra) -> Path:
    path.write_text(json.dumps({
        "EnableCapture": True, "InitialSamplingPercentage": percent, "DestinationS3Uri": destination,
        "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
        "CaptureContentTypeHeader": {"CsvContentTypes": ["text/csv"], "JsonContentTypes": ["application/json"]},
        **extra,
    }))
    return path


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return handler_bundle(tmp_path_factory.mktemp("capture-bundle"), HANDLER)


def published_lines(root: Path) -> list[dict]:
    """Every line of every published capture file under `root` (parsed: a half line fails here)."""
    lines = []
    for path in sorted(root.rglob("*.jsonl")):
        assert not path.name.startswith(".")
        text = path.read_text()
        assert text.endswith("\n"), path
        lines += [json.loads(line) for line in text.splitlines()]
    return lines


def test_invocations_are_captured_in_model_monitors_format(bundle, tmp_path) -> None:
    destination = tmp_path / "capture"
    config = capture_config(tmp_path / "capture.json", str(destination))
    server = ServerProcess([str(bundle), "--data-capture-config", str(config), "--endpoint-name", "my-endpoint"]).start()
    try:
        host, port = server.url.removeprefix("http://").split(":")
        runtime = boto3.client("sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
                               aws_access_key_id="x", aws_secret_access_key="x")
        answer = runtime.invoke_endpoint(EndpointName="my-endpoint", Body=b"1.0,2.0", ContentType="text/csv",
                                         InferenceId="inference-42")
        assert answer["Body"].read() == b"4.0,5.0"
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.post("/invocations", json={"instances": [2.0]}).json() == {"predictions": [4.0]}
            image = client.post("/invocations", content=IMAGE, headers={"Content-Type": "application/x-image"})
            assert image.json() == {"predictions": [len(IMAGE)]}
            assert client.post("/invocations", content=b"{bad", headers={"Content-Type": "application/json"}).status_code >= 400
            assert client.post("/v1/models/half_plus_three:predict", json={"instances": [1.0]}).status_code == 200
            deadline = time.monotonic() + 10
            while "tfservo_capture_lines_total 3.0" not in (metrics := client.get("/metrics").text):
                assert time.monotonic() < deadline, metrics
                time.sleep(0.1)
    finally:
        assert server.stop() == 0  # a graceful stop publishes the open file
    lines = published_lines(destination / "my-endpoint" / "AllTraffic")
    assert len(lines) == 3, lines  # the error and the TF Serving route are not captured
    by_type = {line["captureData"]["endpointInput"]["observedContentType"]: line for line in lines}
    csv = by_type["text/csv"]
    assert csv["captureData"]["endpointInput"] == {"observedContentType": "text/csv", "mode": "INPUT", "data": "1.0,2.0", "encoding": "CSV"}
    assert csv["captureData"]["endpointOutput"]["data"] == "4.0,5.0"
    assert csv["captureData"]["endpointOutput"]["encoding"] == "CSV" and csv["captureData"]["endpointOutput"]["mode"] == "OUTPUT"
    assert csv["eventMetadata"]["inferenceId"] == "inference-42" and csv["eventVersion"] == "0"
    assert csv["eventMetadata"]["inferenceTime"].endswith("Z") and len(csv["eventMetadata"]["eventId"]) == 36
    as_json = by_type["application/json"]
    assert json.loads(as_json["captureData"]["endpointInput"]["data"]) == {"instances": [2.0]}
    assert as_json["captureData"]["endpointInput"]["encoding"] == "JSON"
    assert json.loads(as_json["captureData"]["endpointOutput"]["data"]) == {"predictions": [4.0]}
    image_line = by_type["application/x-image"]
    assert image_line["captureData"]["endpointInput"]["encoding"] == "BASE64"
    assert base64.b64decode(image_line["captureData"]["endpointInput"]["data"]) == IMAGE
    hours = [p.relative_to(destination / "my-endpoint" / "AllTraffic") for p in (destination / "my-endpoint" / "AllTraffic").rglob("*.jsonl")]
    assert all(len(p.parts) == 5 and p.parts[0].isdigit() and len(p.parts[0]) == 4 for p in hours)  # yyyy/mm/dd/hh/file


def test_sampling_at_30_percent_and_all_routes(bundle, tmp_path) -> None:
    destination = tmp_path / "capture"
    config = capture_config(tmp_path / "capture.json", str(destination), percent=30)
    with ServerProcess([str(bundle), "--data-capture-config", str(config), "--data-capture-routes", "all"]) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for i in range(2000):
                path = "/invocations" if i % 2 else "/v1/models/half_plus_three:predict"
                assert client.post(path, json={"instances": [float(i)]}).status_code == 200
        server.stop()
    lines = published_lines(destination / "tfservo" / "AllTraffic")
    # Binomial(2000, 0.3): mean 600, standard deviation 20.5; five of them either side.
    assert 497 <= len(lines) <= 703, len(lines)
    routes = {"predictions" in json.loads(line["captureData"]["endpointOutput"]["data"]) for line in lines}
    assert routes == {True}
    inputs = [json.loads(line["captureData"]["endpointInput"]["data"])["instances"][0] for line in lines]
    assert any(int(x) % 2 == 0 for x in inputs) and any(int(x) % 2 == 1 for x in inputs)  # both routes


def test_a_kill_9_leaves_no_half_line_in_a_published_file(bundle, tmp_path) -> None:
    destination = tmp_path / "capture"
    config = capture_config(tmp_path / "capture.json", str(destination))
    big = {"instances": [1.0] * 5000}  # long lines: a kill mid-write is likely to cut one
    with ServerProcess([str(bundle), "--data-capture-config", str(config)]) as server:
        stop = threading.Event()
        answered = [0]

        def load() -> None:
            with httpx.Client(base_url=server.url, timeout=60, headers={"Connection": "close"}) as client:
                while not stop.is_set():
                    try:
                        if client.post("/invocations", json=big).status_code == 200:
                            answered[0] += 1
                    except httpx.TransportError:
                        pass

        threads = [threading.Thread(target=load) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(3)
        worker = int(next(line for line in server.lines if "pid" in line and "of 1 workers" in line).split("pid ")[1].split()[0])
        os.kill(worker, signal.SIGKILL)  # its replacement publishes what it left, cut at its last full line
        time.sleep(1)
        deadline = time.monotonic() + 120
        while server.output.count("serving ") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        for thread in threads:
            thread.join()
    lines = published_lines(destination / "tfservo" / "AllTraffic")  # every line parses
    assert answered[0] >= len(lines) > 0
    assert not list(destination.rglob(".*.tmp"))


def test_enable_capture_false_starts_no_writer_and_writes_nothing(bundle, tmp_path) -> None:
    config = capture_config(tmp_path / "capture.json", str(tmp_path / "capture"), EnableCapture=False)
    with ServerProcess([str(bundle), "--data-capture-config", str(config)]) as server, \
            httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.post("/invocations", json={"instances": [1.0]}).status_code == 200
        assert "tfservo_capture_lines_total 0.0" in client.get("/metrics").text
        with ServerProcess([str(bundle), "--data-capture-config",
                            str(capture_config(tmp_path / "on.json", str(tmp_path / "on")))]) as capturing, \
                httpx.Client(base_url=capturing.url, timeout=30) as on:
            assert on.post("/invocations", json={"instances": [1.0]}).status_code == 200
            time.sleep(0.5)  # the writer thread writes at least every 0.2 s
            assert "tfservo_capture_lines_total 1.0" in on.get("/metrics").text  # the same checks see a writer
            assert (tmp_path / "on" / "tfservo" / "AllTraffic").is_dir()  # made when a writer starts
    assert not (tmp_path / "capture").exists()


def test_capture_pauses_when_its_disk_is_too_full_and_serving_goes_on(bundle, tmp_path) -> None:
    config = capture_config(tmp_path / "capture.json", str(tmp_path / "capture"))
    args = [str(bundle), "--data-capture-config", str(config), "--data-capture-max-disk-percent", "0.001"]
    with ServerProcess(args) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        for _ in range(20):
            assert client.post("/invocations", json={"instances": [1.0]}).status_code == 200
        time.sleep(0.5)
        metrics = client.get("/metrics").text
        assert "tfservo_capture_paused 1.0" in metrics
        assert 'tfservo_capture_dropped_total{reason="disk"}' in metrics
        assert sum("data capture paused" in line for line in server.lines) == 1


def test_the_sagemaker_sdk_turns_capture_on_into_s3(bundle, s3_endpoint, s3_bucket, tmp_path) -> None:
    from sagemaker.deserializers import StringDeserializer
    from sagemaker.model_monitor import DataCaptureConfig
    from sagemaker.serializers import CSVSerializer
    from sagemaker.tensorflow import TensorFlowModel

    from tfservo.sagemaker_sdk import Session

    archive = tmp_path / "model.tar.gz"
    import tarfile

    with tarfile.open(archive, "w:gz") as tar:
        tar.add(bundle / "half_plus_three", arcname="half_plus_three")
        tar.add(bundle / "code", arcname="code")
    session = Session()
    try:
        model = TensorFlowModel(model_data=f"file://{archive}", role="arn:aws:iam::111111111111:role/tfservo",
                                framework_version="2.12", sagemaker_session=session)
        capture = DataCaptureConfig(enable_capture=True, sampling_percentage=100,
                                    destination_s3_uri=f"s3://{s3_bucket}/capture", sagemaker_session=session)
        predictor = model.deploy(initial_instance_count=1, instance_type="local", data_capture_config=capture,
                                 endpoint_name="captured")
        predictor.serializer, predictor.deserializer = CSVSerializer(), StringDeserializer()
        assert [predictor.predict(values) for values in ([1.0, 2.0], [3.0])] == ["4.0,5.0", "6.0"]
        predictor.delete_endpoint()  # a graceful stop: published and uploaded
    finally:
        session.close()
    s3 = s3_client(s3_endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="capture/captured/AllTraffic/").get("Contents", [])]
    assert keys and all(k.endswith(".jsonl") and len(k.split("/")) == 8 for k in keys), keys
    lines = [json.loads(line) for k in keys for line in s3.get_object(Bucket=s3_bucket, Key=k)["Body"].read().decode().splitlines()]
    assert sorted(line["captureData"]["endpointInput"]["data"] for line in lines) == ["1.0,2.0", "3.0"]
    assert {line["captureData"]["endpointOutput"]["data"] for line in lines} == {"4.0,5.0", "6.0"}


def test_grpc_predict_and_v2_model_infer_are_captured_beside_their_http_twins(tmp_path) -> None:
    """With every inference route captured, TF Serving's gRPC Predict and V2's ModelInfer land in
    the same capture file as the REST requests: the request and answer messages, BASE64, typed
    by their protobuf message; a gRPC error is not captured (as an HTTP error is not)."""
    import grpc
    import numpy as np
    import tritonclient.grpc as triton
    from conftest import SMC, grpc_predict_request
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    destination = tmp_path / "capture"
    config = capture_config(tmp_path / "capture.json", str(destination))
    model = SMC / "resources" / "models" / "half_plus_three"
    with ServerProcess([str(model), "--data-capture-config", str(config), "--data-capture-routes", "all"]) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.post("/v1/models/half_plus_three:predict", json={"instances": [1.0]}).status_code == 200
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            sent = grpc_predict_request("half_plus_three", np.array([2.0], np.float32))
            answered = stub.Predict(sent, timeout=30)
            with pytest.raises(grpc.RpcError):
                stub.Predict(grpc_predict_request("no_such_model", np.array([2.0], np.float32)), timeout=30)
        v2 = triton.InferenceServerClient(server.grpc_target)
        x = triton.InferInput("x", [1], "FP32")
        x.set_data_from_numpy(np.array([5.0], np.float32))
        assert v2.infer("half_plus_three", [x]).as_numpy("y").tolist() == [5.5]
        v2.close()
        server.stop()
    lines = published_lines(destination / "tfservo" / "AllTraffic")
    by_type = {line["captureData"]["endpointInput"]["observedContentType"]: line for line in lines}
    assert len(lines) == 3, sorted(by_type)
    assert json.loads(by_type["application/json"]["captureData"]["endpointInput"]["data"]) == {"instances": [1.0]}
    predict = by_type["application/x-protobuf; messageType=tensorflow.serving.PredictRequest"]["captureData"]
    assert predict["endpointInput"]["encoding"] == "BASE64"
    assert predict_pb2.PredictRequest.FromString(base64.b64decode(predict["endpointInput"]["data"])) == sent
    assert predict["endpointOutput"]["observedContentType"].endswith("messageType=tensorflow.serving.PredictResponse")
    assert predict_pb2.PredictResponse.FromString(base64.b64decode(predict["endpointOutput"]["data"])) == answered
    infer = by_type["application/x-protobuf; messageType=inference.ModelInferRequest"]["captureData"]
    assert infer["endpointOutput"]["observedContentType"].endswith("messageType=inference.ModelInferResponse")


def test_a_filling_disk_pauses_capture_at_its_mark_and_capture_resumes_once_space_returns(bundle, tmp_path) -> None:
    """On a small disk capture stops short of its mark (75 %), serving goes on, and once space
    returns it resumes by itself (its metric back to 0); every line counted as captured is in a
    published file, and no temporary file is left."""
    import shutil

    from small_disk import resize, small_disk

    with small_disk(tmp_path / "disk", "256k") as disk:
        config = capture_config(tmp_path / "capture.json", str(disk))
        body = {"instances": [float(i) for i in range(300)]}
        with ServerProcess([str(bundle), "--data-capture-config", str(config), "--workers", "1"]) as server, \
                httpx.Client(base_url=server.url, timeout=30) as client:
            for _ in range(200):
                assert client.post("/invocations", json=body).status_code == 200
            time.sleep(0.6)
            usage = shutil.disk_usage(disk)
            assert usage.used / usage.total <= 0.76, usage
            assert "tfservo_capture_paused 1.0" in client.get("/metrics").text
            resize(disk, "16m")
            time.sleep(1.5)  # the paused writer looks at its disk every second
            for _ in range(20):
                assert client.post("/invocations", json=body).status_code == 200
            time.sleep(0.6)
            metrics = client.get("/metrics").text
            assert "tfservo_capture_paused 0.0" in metrics, metrics
            server.wait_for("data capture resumed")
            captured = next(line for line in metrics.splitlines() if line.startswith("tfservo_capture_lines_total"))
        lines = published_lines(disk)
        assert len(lines) == int(float(captured.split()[-1])) and len(lines) > 20
        assert not [p for p in disk.rglob(".*") if p.is_file()]



def test_a_write_the_disk_refuses_leaves_its_lines_published_and_no_temporary(bundle, tmp_path) -> None:
    """A mark past 100 % never pauses, so the disk itself refuses writes (ENOSPC): each refused
    write cuts its file back to whole lines and publishes it — every line counted as captured is
    in a published file, none half-written, no temporary file left, serving unharmed."""
    from small_disk import small_disk

    with small_disk(tmp_path / "disk", "64k") as disk:
        config = capture_config(tmp_path / "capture.json", str(disk))
        body = {"instances": [float(i) for i in range(300)]}
        args = [str(bundle), "--data-capture-config", str(config), "--workers", "1",
                "--data-capture-max-disk-percent", "200"]
        with ServerProcess(args) as server, httpx.Client(base_url=server.url, timeout=30) as client:
            for _ in range(6):
                for _ in range(10):
                    assert client.post("/invocations", json=body).status_code == 200
                time.sleep(0.3)  # a write each time
            metrics = client.get("/metrics").text
            captured = next(line for line in metrics.splitlines() if line.startswith("tfservo_capture_lines_total"))
            assert 'tfservo_capture_dropped_total{reason="error"}' in metrics
        assert "data capture: cannot write" in server.output  # the disk refused a write
        lines = published_lines(disk)
        assert len(lines) == int(float(captured.split()[-1])) > 0
        assert not [p for p in disk.rglob(".*") if p.is_file()]
