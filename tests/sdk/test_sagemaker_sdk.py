"""The SageMaker Python SDK (v2), unchanged but for `sagemaker_session=tfservo.sagemaker_sdk.Session()`:
the SDK guide's deploy, every predict form, classify/regress, model_name/model_version,
MultiDataModel, a transform job with filters and `.wait()`, a Predictor reaching an endpoint by
name, and errors raised as against SageMaker. No Docker, no AWS: S3 is moto's server."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import boto3
import pytest
from conftest import SMC, TFS, write_code

sagemaker = pytest.importorskip("sagemaker")
from botocore.exceptions import ClientError  # noqa: E402
from sagemaker.deserializers import BytesDeserializer, JSONDeserializer  # noqa: E402
from sagemaker.exceptions import UnexpectedStatusException  # noqa: E402
from sagemaker.inputs import BatchDataCaptureConfig  # noqa: E402
from sagemaker.multidatamodel import MultiDataModel  # noqa: E402
from sagemaker.predictor import Predictor  # noqa: E402
from sagemaker.serializers import CSVSerializer, IdentitySerializer, JSONSerializer  # noqa: E402
from sagemaker.tensorflow import TensorFlowModel, TensorFlowPredictor  # noqa: E402

from tfservo.sagemaker_sdk import Session  # noqa: E402

ROLE = "arn:aws:iam::111111111111:role/SageMakerRole"
HALF_PLUS_TWO = TFS / "saved_model_half_plus_two_cpu"
HALF_PLUS_THREE = SMC / "resources" / "models" / "half_plus_three"

# The SDK guide's input/output handlers, with a helper module shipped as a dependency.
INFERENCE = """
    import json

    from scaling import factor


    def input_handler(data, context):
        if context.request_content_type == "application/json":
            return data.read().decode("utf-8")
        if context.request_content_type == "text/csv":
            values = data.read().decode("utf-8").strip().split(",")
            return json.dumps({"instances": [float(v) * factor for v in values]})
        if context.request_content_type == "application/octet-stream":
            return json.dumps({"instances": [float(b) for b in data.read()]})
        raise ValueError("{{\\"error\\": \\"unsupported content type {}\\"}}".format(context.request_content_type))


    def output_handler(response, context):
        if response.status_code != 200:
            raise ValueError(response.content.decode("utf-8"))
        return response.content, context.accept_header
"""


def tar_models(path: Path, models: dict[str, Path]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, model_dir in models.items():
            for version in (p for p in model_dir.iterdir() if p.name.isdigit()):
                tar.add(version, arcname=f"{name}/{version.name}" if name else version.name)
    return path


@pytest.fixture(scope="module")
def session(s3_endpoint):
    session = Session()  # the S3 of AWS_ENDPOINT_URL_S3 (moto's server, set by the fixture)
    yield session
    session.close()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    work = tmp_path_factory.mktemp("sdk")
    model_data = tar_models(work / "model.tar.gz", {"half_plus_two": HALF_PLUS_TWO, "half_plus_three": HALF_PLUS_THREE})
    code = write_code(work / "src", INFERENCE)
    lib = work / "deps" / "scaling"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("factor = 1.0\n")
    return model_data, code, lib


@pytest.fixture(scope="module")
def predictor(session, bundle):
    model_data, code, lib = bundle
    model = TensorFlowModel(
        model_data=f"file://{model_data}",
        role=ROLE,
        framework_version="2.12",
        entry_point="inference.py",
        source_dir=str(code),
        dependencies=[str(lib)],
        env={"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "half_plus_three"},
        sagemaker_session=session,
    )
    predictor = model.deploy(initial_instance_count=1, instance_type="local")
    yield predictor
    try:
        predictor.delete_endpoint()
    except ClientError:
        pass  # the test deleted it


def test_deploy_and_every_predict_form(session, predictor):
    assert isinstance(predictor, TensorFlowPredictor)
    assert predictor.predict({"instances": [1.0, 2.0]}) == {"predictions": [3.5, 4.0]}
    predictor.serializer = CSVSerializer()
    assert predictor.predict([1.0, 2.0, 5.0]) == {"predictions": [3.5, 4.0, 5.5]}
    raw = TensorFlowPredictor(
        predictor.endpoint_name, session, serializer=IdentitySerializer("application/octet-stream")
    )
    assert raw.predict(bytes([1, 2])) == {"predictions": [3.5, 4.0]}
    named = TensorFlowPredictor(predictor.endpoint_name, session, model_name="half_plus_two")
    assert named.predict({"instances": [1.0]}) == {"predictions": [2.5]}
    versioned = TensorFlowPredictor(predictor.endpoint_name, session, model_name="half_plus_two", model_version="123")
    assert versioned.predict({"instances": [2.0]}) == {"predictions": [3.0]}
    assert named.regress({"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]}) == {"results": [3.0]}
    classified = named.classify({"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]})
    assert classified["results"][0][0][1] == pytest.approx(3.0)


def test_an_async_endpoint_answers_predict_async_and_predict(session, s3_bucket, tmp_path):
    """model.deploy(async_inference_config=...) gives an AsyncPredictor; its predict_async queues
    the request (input uploaded to S3) and its predict waits for the answer object."""
    from sagemaker.async_inference import AsyncInferenceConfig, WaiterConfig
    from sagemaker.exceptions import AsyncInferenceModelError
    from sagemaker.predictor_async import AsyncPredictor

    model = TensorFlowModel(model_data=f"file://{tar_models(tmp_path / 'model.tar.gz', {'': HALF_PLUS_THREE})}",
                            role=ROLE, framework_version="2.12", sagemaker_session=session,
                            env={"TFSERVO_LOG_LEVEL": "warning"})  # the session still finds its ready line
    config = AsyncInferenceConfig(output_path=f"s3://{s3_bucket}/async-out", failure_path=f"s3://{s3_bucket}/async-failed")
    predictor = model.deploy(initial_instance_count=1, instance_type="local", async_inference_config=config)
    try:
        assert isinstance(predictor, AsyncPredictor)
        json_body = {"ContentType": "application/json"}  # AsyncPredictor sends no ContentType of its own
        assert predictor.predict({"instances": [1.0, 2.0]}, initial_args=json_body) == {"predictions": [3.5, 4.0]}
        response = predictor.predict_async({"instances": [5.0]}, initial_args=json_body)
        assert response.output_path.startswith(f"s3://{s3_bucket}/async-out/")
        assert response.get_result(WaiterConfig(max_attempts=60, delay=1)) == {"predictions": [5.5]}
        with pytest.raises(AsyncInferenceModelError, match="Unsupported Media Type: Unknown"):
            predictor.predict({"instances": [1.0]}, waiter_config=WaiterConfig(max_attempts=60, delay=1))
    finally:
        predictor.delete_endpoint()


def test_errors_raise_as_against_sagemaker(session, predictor):
    client = session.sagemaker_runtime_client.client(session.control_plane.endpoint_url(predictor.endpoint_name))
    # The SDK's LocalSession hands this error body back as if it were a prediction.
    with pytest.raises(client.exceptions.ModelError) as caught:
        TensorFlowPredictor(predictor.endpoint_name, session).classify({"examples": [{"x": 1.0}]})  # half_plus_three has no classify signature
    assert caught.value.response["OriginalStatusCode"] == 500  # the guide's output_handler raises
    assert "classify" in caught.value.response["OriginalMessage"]
    unsupported = TensorFlowPredictor(predictor.endpoint_name, session, serializer=IdentitySerializer("image/png"))
    with pytest.raises(client.exceptions.ModelError, match="unsupported content type image/png"):
        unsupported.predict(b"\x89PNG")


def test_a_predictor_reaches_an_endpoint_started_elsewhere_by_name(tfs_server, s3_endpoint):
    elsewhere = Session(endpoint_url=tfs_server.url)
    try:
        predictor = Predictor("served-by-cli", sagemaker_session=elsewhere, serializer=JSONSerializer(),
                              deserializer=JSONDeserializer())
        assert predictor.predict({"instances": [1.0]}) == {"predictions": [3.5]}
    finally:
        elsewhere.close()
    alone = Session()
    try:
        with pytest.raises(ClientError, match="not found: this session did not start it"):
            Predictor("nowhere", sagemaker_session=alone).predict(b"[1]")
    finally:
        alone.close()


def test_multi_data_model_loads_targets(session, s3_bucket, tmp_path):
    for name, model_dir in (("two", HALF_PLUS_TWO), ("three", HALF_PLUS_THREE)):
        tar_models(tmp_path / f"{name}.tar.gz", {"": model_dir})
    mdm = MultiDataModel(
        name="tfservo-mme", model_data_prefix=f"s3://{s3_bucket}/mme/", image_uri="tfservo", role=ROLE,
        predictor_cls=Predictor, sagemaker_session=session,
    )
    predictor = mdm.deploy(initial_instance_count=1, instance_type="local", serializer=JSONSerializer(),
                           deserializer=JSONDeserializer())
    try:
        mdm.add_model(model_data_source=str(tmp_path / "two.tar.gz"), model_data_path="two.tar.gz")
        mdm.add_model(model_data_source=str(tmp_path / "three.tar.gz"), model_data_path="three.tar.gz")
        assert sorted(mdm.list_models()) == ["three.tar.gz", "two.tar.gz"]
        assert predictor.predict({"instances": [1.0]}, target_model="two.tar.gz") == {"predictions": [2.5]}
        assert predictor.predict({"instances": [1.0]}, target_model="three.tar.gz") == {"predictions": [3.5]}
        # The TensorFlow way (docs/clients.md): TensorFlowPredictor.predict has no target_model=,
        # the SDK's initial_args carries the header's field.
        from sagemaker.tensorflow import TensorFlowPredictor

        tf_predictor = TensorFlowPredictor(predictor.endpoint_name, sagemaker_session=session)
        assert tf_predictor.predict({"instances": [1.0]}, initial_args={"TargetModel": "two.tar.gz"}) == \
            {"predictions": [2.5]}
        with pytest.raises(TypeError, match="target_model"):
            tf_predictor.predict({"instances": [1.0]}, target_model="two.tar.gz")
    finally:
        predictor.delete_endpoint()


def test_transform_job_with_filters_join_and_wait(session, s3_bucket, tmp_path, capsys):
    model_data = tar_models(tmp_path / "model.tar.gz", {"": HALF_PLUS_THREE})
    s3 = boto3.client("s3")
    for i in range(4):
        rows = "".join(f"id-{i}-{j},{float(j)}\n" for j in range(5))
        s3.put_object(Bucket=s3_bucket, Key=f"in/part-{i}.csv", Body=rows.encode())
    model = TensorFlowModel(model_data=f"file://{model_data}", role=ROLE, framework_version="2.12",
                            sagemaker_session=session)
    transformer = model.transformer(
        instance_count=2, instance_type="local", strategy="MultiRecord", assemble_with="Line", accept="text/csv",
        max_payload=1, max_concurrent_transforms=2, output_path=f"s3://{s3_bucket}/out/",
    )
    transformer.transform(
        f"s3://{s3_bucket}/in/", content_type="text/csv", split_type="Line", input_filter="$[1:]",
        join_source="Input", output_filter="$[0,-1]", wait=False,
        batch_data_capture_config=BatchDataCaptureConfig(f"s3://{s3_bucket}/capture/", generate_inference_id=True),
    )
    transformer.wait()
    assert "objects" in capsys.readouterr().out  # tfservo transform's progress, shown by wait()
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="out/")["Contents"])
    assert keys == [f"out/part-{i}.csv.out" for i in range(4)]  # the output prefix holds only .out files
    out = s3.get_object(Bucket=s3_bucket, Key="out/part-2.csv.out")["Body"].read().decode()
    assert out.splitlines() == [f"id-2-{j},{j * 0.5 + 3.0}" for j in range(5)]
    described = session.describe_transform_job(transformer.latest_transform_job.name)
    assert described["TransformJobStatus"] == "Completed"
    progress = described["TransformJobProgress"]  # tfservo's own: objects done of all, records, rate
    assert (progress["ObjectsDone"], progress["ObjectsTotal"], progress["ObjectsFailed"], progress["Records"]) == \
        (4, 4, 0, 20), progress
    captured = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="capture/")["Contents"]]
    assert sorted(key.rsplit("/", 1)[1] for key in captured) == [f"part-{i}.csv.jsonl" for i in range(4)]
    line = json.loads(s3.get_object(Bucket=s3_bucket, Key=captured[0])["Body"].read().splitlines()[0])
    assert line["captureData"]["endpointInput"]["observedContentType"] == "text/csv"
    assert line["eventMetadata"]["inferenceId"].endswith(".csv:1")  # BatchDataCaptureConfig's GenerateInferenceId

    s3.put_object(Bucket=s3_bucket, Key="bad/part.csv", Body=b"id,not-a-number\n")
    failing = model.transformer(instance_count=1, instance_type="local", output_path=f"s3://{s3_bucket}/bad-out/")
    with pytest.raises(UnexpectedStatusException, match="Failed") as caught:
        failing.transform(f"s3://{s3_bucket}/bad/", content_type="text/csv", split_type="Line")
    assert "part.csv" in str(caught.value)


def test_the_session_works_with_no_s3_configured(monkeypatch, tmp_path, bundle):
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    local = Session()  # no endpoint, no credentials: its own S3 on loopback
    try:
        model_data, code, lib = bundle
        model = TensorFlowModel(
            model_data=f"file://{model_data}", role=ROLE, framework_version="2.12", entry_point="inference.py",
            source_dir=str(code), dependencies=[str(lib)], sagemaker_session=local,
            env={"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "half_plus_two"},
        )
        predictor = model.deploy(initial_instance_count=1, instance_type="local", deserializer=BytesDeserializer())
        assert json.loads(predictor.predict({"instances": [4.0]})) == {"predictions": [4.0]}
        predictor.delete_model()
        predictor.delete_endpoint()
        with pytest.raises(ClientError, match="not found"):
            predictor.predict({"instances": [4.0]})  # stopped
    finally:
        local.close()


def test_an_endpoint_that_cannot_start_raises_with_the_reason(session, tmp_path):
    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz"):
        pass
    model = TensorFlowModel(model_data=f"file://{empty}", role=ROLE, framework_version="2.12", sagemaker_session=session)
    with pytest.raises(UnexpectedStatusException, match="Error hosting endpoint .*: Failed. Reason: tfservo serve exited"):
        model.deploy(initial_instance_count=1, instance_type="local")
