"""Inference pipelines, production variants and shadow variants through the SageMaker SDK and
boto3, unchanged, against a `tfservo.sagemaker_sdk.Session`: a PipelineModel deployed, invoked
and used as a transformer answers the bytes one bundle doing both answers; an endpoint of two
variants splits traffic by weight, honours TargetVariant and names the variant, takes new
weights while serving; a shadow that sleeps leaves production's latency alone while its
captures hold both answers."""

from __future__ import annotations

import base64
import json
import math
import statistics
import tarfile
import threading
import time
from pathlib import Path

import boto3
import pytest
from conftest import SMC, TFS, write_code

sagemaker = pytest.importorskip("sagemaker")
from botocore.exceptions import ClientError  # noqa: E402
from sagemaker.model import Model  # noqa: E402
from sagemaker.pipeline import PipelineModel  # noqa: E402
from sagemaker.predictor import Predictor  # noqa: E402
from sagemaker.serializers import CSVSerializer  # noqa: E402
from sagemaker.session import production_variant  # noqa: E402

from tfservo.capture.compare import compare_captures  # noqa: E402
from tfservo.sagemaker_sdk import Session  # noqa: E402

ROLE = "arn:aws:iam::111111111111:role/SageMakerRole"
HALF_PLUS_TWO = TFS / "saved_model_half_plus_two_cpu"
HALF_PLUS_THREE = SMC / "resources" / "models" / "half_plus_three"
IMAGE = "tfservo"  # any image name: tfservo serves the model data

# The conversion container: code alone, CSV rows in, TF Serving's JSON request out.
CSV_TO_JSON = """
    import json

    def handler(data, context):
        rows = [float(v) for v in data.read().decode().replace(",", "\\n").split()]
        return json.dumps({"instances": rows}), "application/json"
"""

# One bundle doing both: the same conversion before the model, the model's answer as it is.
BOTH = """
    import json

    def input_handler(data, context):
        rows = [float(v) for v in data.read().decode().replace(",", "\\n").split()]
        return json.dumps({"instances": rows})

    def output_handler(response, context):
        return response.content, "application/json"
"""

SLOW = """
    import time

    def input_handler(data, context):
        time.sleep(5)
        return data.read().decode()

    def output_handler(response, context):
        return response.content, "application/json"
"""


def archive(path: Path, model: Path | None, code: str | None) -> Path:
    """A model.tar.gz: the model's versions at its root (as SageMaker's TensorFlow models are) and code/."""
    work = path.parent / (path.name + ".src")
    if code is not None:
        write_code(work / "code", code)
    with tarfile.open(path, "w:gz") as tar:
        if model is not None:
            for version in (p for p in model.iterdir() if p.name.isdigit()):
                tar.add(version, arcname=version.name)
        if code is not None:
            tar.add(work / "code", arcname="code")
    return path


@pytest.fixture(scope="module")
def session(s3_endpoint):
    session = Session()
    yield session
    session.close()


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    work = tmp_path_factory.mktemp("bundles")
    return {
        "pre": archive(work / "pre.tar.gz", None, CSV_TO_JSON),
        "model": archive(work / "model.tar.gz", HALF_PLUS_THREE, None),
        "both": archive(work / "both.tar.gz", HALF_PLUS_THREE, BOTH),
        "two": archive(work / "two.tar.gz", HALF_PLUS_TWO, None),
        "slow": archive(work / "slow.tar.gz", HALF_PLUS_TWO, SLOW),
    }


def model(session, path: Path) -> Model:
    return Model(image_uri=IMAGE, model_data=f"file://{path}", role=ROLE, predictor_cls=Predictor,
                 sagemaker_session=session)


def test_a_pipeline_model_answers_as_one_bundle_doing_both(session, archives, tmp_path):
    pipeline = PipelineModel(models=[model(session, archives["pre"]), model(session, archives["model"])], role=ROLE,
                             predictor_cls=Predictor, sagemaker_session=session)
    chained = pipeline.deploy(initial_instance_count=1, instance_type="local", serializer=CSVSerializer())
    single = model(session, archives["both"]).deploy(initial_instance_count=1, instance_type="local",
                                                     serializer=CSVSerializer())
    try:
        assert session.sagemaker_client.describe_model(ModelName=pipeline.name)["Containers"][1]["ModelDataUrl"] \
            == f"file://{archives['model']}"
        for rows in ([1.0, 2.0, 5.0], [0.5], "3\n4\n"):
            values = [float(v) for v in rows.split()] if isinstance(rows, str) else rows
            answer = chained.predict(rows)
            assert answer == single.predict(rows)  # byte for byte
            assert json.loads(answer) == {"predictions": [v / 2 + 3 for v in values]}
        # a failing container answers as SageMaker does: which container, its status and message
        runtime = boto3.client("sagemaker-runtime", endpoint_url=session.control_plane.endpoint_url(
            chained.endpoint_name), region_name="us-east-1")
        with pytest.raises(ClientError) as raised:
            runtime.invoke_endpoint(EndpointName=chained.endpoint_name, Body=b"not,a,number", ContentType="text/csv")
        error = raised.value.response
        assert error["Error"]["Code"] == "ModelError"
        assert "from container-1 with message" in error["Error"]["Message"]
        assert error["OriginalStatusCode"] == 500 and "could not convert string to float" in error["OriginalMessage"]
    finally:
        chained.delete_endpoint()
        single.delete_endpoint()

    # the same pipeline as a batch transform: the same bytes as the one bundle's transform
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "rows.csv").write_text("1\n2\n3\n")
    outputs = {}
    for name, m in (("chained", pipeline), ("single", model(session, archives["both"]))):
        transformer = m.transformer(instance_count=1, instance_type="local", strategy="SingleRecord",
                                    output_path=f"file://{tmp_path / name}")
        transformer.transform(f"file://{inputs}", content_type="text/csv", split_type="Line", wait=True)
        outputs[name] = (tmp_path / name / "rows.csv.out").read_bytes()
    assert outputs["chained"] == outputs["single"]
    assert outputs["chained"].count(b'"predictions"') == 3 and b"3.5" in outputs["chained"]


def test_direct_invocation_reaches_the_container_named(session, archives):
    for name, path in (("direct-pre", archives["pre"]), ("direct-model", archives["model"])):
        session.sagemaker_client.create_model(ModelName=name, PrimaryContainer={
            "Image": IMAGE, "ModelDataUrl": f"file://{path}"})
    session.sagemaker_client.create_model(
        ModelName="direct", InferenceExecutionConfig={"Mode": "Direct"}, Containers=[
            {"Image": IMAGE, "ModelDataUrl": f"file://{archives['pre']}", "ContainerHostname": "convert"},
            {"Image": IMAGE, "ModelDataUrl": f"file://{archives['model']}", "ContainerHostname": "model"},
        ])
    session.endpoint_from_production_variants("direct", [production_variant("direct", "local", 1)])
    runtime = boto3.client("sagemaker-runtime", endpoint_url=session.control_plane.endpoint_url("direct"),
                           region_name="us-east-1")
    try:
        converted = runtime.invoke_endpoint(EndpointName="direct", Body=b"1,2", ContentType="text/csv",
                                            TargetContainerHostname="convert")
        assert json.loads(converted["Body"].read()) == {"instances": [1.0, 2.0]}
        answered = runtime.invoke_endpoint(EndpointName="direct", Body=b'{"instances": [1.0]}',
                                           ContentType="application/json", TargetContainerHostname="model")
        assert json.loads(answered["Body"].read()) == {"predictions": [3.5]}
        with pytest.raises(ClientError, match="TargetContainerHostname"):
            runtime.invoke_endpoint(EndpointName="direct", Body=b"1", ContentType="text/csv")
        with pytest.raises(ClientError, match="not a container of this endpoint; its containers are convert, model"):
            runtime.invoke_endpoint(EndpointName="direct", Body=b"1", ContentType="text/csv",
                                    TargetContainerHostname="other")
    finally:
        session.delete_endpoint("direct")


def test_two_variants_split_by_weight_and_target_variant_pins_one(session, archives, tmp_path):
    for name, path in (("variant-three", archives["model"]), ("variant-two", archives["two"])):
        session.create_model(name, ROLE, {"Image": IMAGE, "ModelDataUrl": f"file://{path}"})
    capture = tmp_path / "capture"
    session.endpoint_from_production_variants("split", [
        production_variant("variant-three", "local", 1, variant_name="A", initial_weight=0.8),
        production_variant("variant-two", "local", 2, variant_name="B", initial_weight=0.2),
    ], data_capture_config_dict={"EnableCapture": True, "InitialSamplingPercentage": 100,
                                 "DestinationS3Uri": f"file://{capture}",
                                 "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}]})
    url = session.control_plane.endpoint_url("split")
    runtime = boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1")
    answers = {"A": [3.5], "B": [2.5]}  # half_plus_three and half_plus_two of 1.0
    try:
        counts = {"A": 0, "B": 0}
        for _ in range(1000):
            r = runtime.invoke_endpoint(EndpointName="split", Body=b'{"instances": [1.0]}',
                                        ContentType="application/json")
            variant = r["InvokedProductionVariant"]
            counts[variant] += 1
            assert json.loads(r["Body"].read())["predictions"] == answers[variant]
        bound = 4.5 * math.sqrt(1000 * 0.8 * 0.2)  # binomial(1000, 0.8): 4.5 standard deviations
        assert abs(counts["A"] - 800) <= bound, counts
        for _ in range(20):
            pinned = runtime.invoke_endpoint(EndpointName="split", Body=b'{"instances": [1.0]}',
                                             ContentType="application/json", TargetVariant="B")
            assert pinned["InvokedProductionVariant"] == "B"
            assert json.loads(pinned["Body"].read())["predictions"] == [2.5]
        with pytest.raises(runtime.exceptions.ValidationError, match="its variants are A, B"):
            runtime.invoke_endpoint(EndpointName="split", Body=b"{}", ContentType="application/json",
                                    TargetVariant="C")
        described = session.sagemaker_client.describe_endpoint(EndpointName="split")["ProductionVariants"]
        assert [(v["VariantName"], v["CurrentWeight"], v["CurrentInstanceCount"]) for v in described] == [
            ("A", 0.8, 1), ("B", 0.2, 2)]

        # new weights while a client keeps sending: no request fails, and then B answers them all
        failures: list[BaseException] = []
        stop = threading.Event()

        def keep_sending() -> None:
            client = boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1")
            while not stop.is_set():
                try:
                    client.invoke_endpoint(EndpointName="split", Body=b'{"instances": [1.0]}',
                                           ContentType="application/json")
                except Exception as exc:  # any failure is the test's finding
                    failures.append(exc)

        sender = threading.Thread(target=keep_sending)
        sender.start()
        time.sleep(0.3)
        session.sagemaker_client.update_endpoint_weights_and_capacities(
            EndpointName="split", DesiredWeightsAndCapacities=[{"VariantName": "A", "DesiredWeight": 0.0}])
        time.sleep(0.3)
        stop.set()
        sender.join()
        assert not failures, failures[:3]
        after = {runtime.invoke_endpoint(EndpointName="split", Body=b'{"instances": [1.0]}',
                                         ContentType="application/json")["InvokedProductionVariant"]
                 for _ in range(50)}
        assert after == {"B"}
        described = session.sagemaker_client.describe_endpoint(EndpointName="split")["ProductionVariants"]
        assert [(v["VariantName"], v["CurrentWeight"]) for v in described] == [("A", 0.0), ("B", 0.2)]
        with pytest.raises(ClientError, match="not a production variant of this endpoint"):
            session.sagemaker_client.update_endpoint_weights_and_capacities(
                EndpointName="split", DesiredWeightsAndCapacities=[{"VariantName": "Z", "DesiredWeight": 1.0}])
        metrics = __import__("urllib.request").request.urlopen(url + "/metrics").read().decode()
        assert 'tfservo_variant_invocations_total{status="200",variant="A"}' in metrics
        assert 'tfservo_variant_invocations_total{status="200",variant="B"}' in metrics
    finally:
        session.delete_endpoint("split")
    # per-variant capture, as SageMaker writes it: {destination}/{endpoint}/{variant}/...
    lines = {v: [json.loads(line) for f in (capture / "split" / v).rglob("*.jsonl") for line in f.read_text().splitlines()]
             for v in ("A", "B")}
    assert len(lines["A"]) >= counts["A"] and len(lines["B"]) >= counts["B"] + 20 + 50
    for variant, want in answers.items():  # every line in the folder of the variant that answered it
        outputs = [line["captureData"]["endpointOutput"] for line in lines[variant]]
        assert {json.loads(base64.b64decode(o["data"]) if o["encoding"] == "BASE64" else o["data"])["predictions"][0]
                for o in outputs} == set(want)


def test_a_slow_shadow_never_slows_production_and_both_answers_are_captured(session, archives, tmp_path):
    session.create_model("shadow-prod", ROLE, {"Image": IMAGE, "ModelDataUrl": f"file://{archives['two']}"})
    session.create_model("shadow-slow", ROLE, {"Image": IMAGE, "ModelDataUrl": f"file://{archives['slow']}"})
    capture = tmp_path / "capture"
    capture_config = {"EnableCapture": True, "InitialSamplingPercentage": 100, "DestinationS3Uri": f"file://{capture}",
                      "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}]}

    def timed(endpoint: str, n: int) -> list[float]:
        runtime = boto3.client("sagemaker-runtime", endpoint_url=session.control_plane.endpoint_url(endpoint),
                               region_name="us-east-1")
        seconds = []
        for i in range(n):
            started = time.perf_counter()
            r = runtime.invoke_endpoint(EndpointName=endpoint, Body=json.dumps({"instances": [float(i)]}).encode(),
                                        ContentType="application/json")
            seconds.append(time.perf_counter() - started)
            assert r["InvokedProductionVariant"] == "AllTraffic"
            assert json.loads(r["Body"].read()) == {"predictions": [i / 2 + 2]}
        return seconds

    session.endpoint_from_production_variants("plain", [production_variant("shadow-prod", "local", 1)])
    try:
        timed("plain", 10)
        baseline = timed("plain", 40)
    finally:
        session.delete_endpoint("plain")
    client = session.sagemaker_client
    client.create_endpoint_config(
        EndpointConfigName="shadowed", DataCaptureConfig=capture_config,
        ProductionVariants=[{"VariantName": "AllTraffic", "ModelName": "shadow-prod", "InitialInstanceCount": 1,
                             "InstanceType": "local", "InitialVariantWeight": 1.0}],
        ShadowProductionVariants=[{"VariantName": "Shadow", "ModelName": "shadow-slow", "InitialInstanceCount": 1,
                                   "InstanceType": "local", "InitialVariantWeight": 1.0}])
    client.create_endpoint(EndpointName="shadowed", EndpointConfigName="shadowed")
    try:
        timed("shadowed", 2)
        shadowed = timed("shadowed", 6)
        assert max(shadowed) < 1.0, shadowed  # each copy takes 5 s in the shadow; none of that reaches production
        p99 = sorted(shadowed)[-1]
        assert p99 <= 3 * sorted(baseline)[-1] + 0.05, (shadowed, statistics.median(baseline))
        time.sleep(11)  # the shadow's four threads answer the eight copies in two rounds of 5 s
    finally:
        session.delete_endpoint("shadowed")
    production, shadow = capture / "shadowed" / "AllTraffic", capture / "shadowed" / "Shadow"
    result = compare_captures(str(production), str(shadow))
    assert result.pairs == 8 and result.production_only == 0 and result.shadow_only == 0
    assert result.identical == 8 and result.different == 0
    assert result.shadow_latency_ms["p50"] >= 5000 > result.production_latency_ms["p99"]
