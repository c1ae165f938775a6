"""Shared test fixtures: paths to the real test data and server processes."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTDATA = Path(os.environ.get("TFSERVO_TESTDATA", REPO.parent / "shared" / "testdata")).resolve()
TFS = TESTDATA / "tf-serving"
SMC = TESTDATA / "sagemaker-tfs-container"


# An inference.py that refuses negative rows (a record of its own failing) and answers the rest.
NEGATIVE_QUOTES_HANDLER = """
    import json

    def input_handler(data, context):
        rows = [float(v) for v in data.read().decode().split()]
        if any(r < 0 for r in rows):
            raise ValueError(f"negative values are not quotes: {min(rows)}")
        return json.dumps({"instances": rows})

    def output_handler(response, context):
        predictions = response.json()["predictions"]
        return "\\n".join(f"{p:.2f}" for p in predictions), "text/plain"
"""


def write_code(code_dir: Path, source: str, files: dict[str, str] | None = None) -> Path:
    """A bundle's code dir: inference.py from `source` and any other files (text dedented)."""
    code_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / "inference.py").write_text(textwrap.dedent(source))
    for name, text in (files or {}).items():
        path = code_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return code_dir


def handler_bundle(root: Path, source: str) -> Path:
    """A bundle in `root`: the SageMaker container's half_plus_three (version 124) and a
    code/inference.py from `source`."""
    import shutil

    shutil.copytree(SMC / "resources" / "models" / "half_plus_three" / "00000124", root / "half_plus_three" / "00000124")
    write_code(root / "code", source)
    return root


def write_wheel(folder: Path, name: str, version: str, modules: dict[str, str]) -> Path:
    """A pure-Python wheel built by hand (no network, no build backend): `modules` maps paths
    such as "PIL/__init__.py" to their source. pip installs it from a requirements.txt line."""
    import base64
    import hashlib
    import zipfile

    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        **modules,
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tfservo-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


@pytest.fixture(scope="session")
def testdata() -> Path:
    if not TESTDATA.is_dir():
        pytest.fail(f"test data not found at {TESTDATA}; set TFSERVO_TESTDATA")
    return TESTDATA


@pytest.fixture(scope="session")
def slow_model(tmp_path_factory) -> Path:
    """x float32[-1] → x + 1 after 1 s (TF's sleep op, no Python)."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing as tf_data_testing

    class Slow(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            delayed = tf.data.Dataset.from_tensors(x).apply(tf_data_testing.sleep(1_000_000))
            return {"y": delayed.get_single_element() + 1.0}

    root = tmp_path_factory.mktemp("slow") / "slow"
    module = Slow()
    tf.saved_model.save(module, str(root / "1"), signatures={"serving_default": module.serve.get_concrete_function()})
    return root


from s3_server import s3_bucket, s3_endpoint  # noqa: E402,F401  (moto S3 fixtures for all tests)


@pytest.fixture(scope="session")
def tfs_server(testdata):
    """One `tfservo serve` on the TF Serving and SageMaker-container test models, shared by tests."""
    from server_process import ServerProcess

    server = ServerProcess(
        [
            str(TFS / "saved_model_half_plus_two_2_versions"),
            str(TFS / "saved_model_half_plus_three"),
            str(TFS / "saved_model_half_plus_two_tf2_cpu"),
            str(SMC / "resources" / "models" / "half_plus_three"),
            "--version-label",
            "saved_model_half_plus_two_2_versions:stable=123",
            "--version-label",
            "saved_model_half_plus_two_2_versions:canary=124",
            "--max-request-mb",
            "4",
        ],
        env={"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "half_plus_three"},
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def http(tfs_server):
    with tfs_server.client() as client:
        yield client


@contextmanager
def tfs_grpc(target: str) -> Iterator[tuple]:
    """TF Serving's own stubs on one channel to `target`: (PredictionService, ModelService)."""
    import grpc
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel), model_service_pb2_grpc.ModelServiceStub(channel)


def grpc_predict_request(name: str, x, version: int | None = None, label: str | None = None, **spec):
    """A PredictRequest for model `name` with float32 input "x" (model_spec fields as given)."""
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    for key, value in spec.items():
        setattr(request.model_spec, key, value)
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.asarray(x, np.float32)))
    return request
