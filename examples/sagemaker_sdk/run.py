"""The SageMaker SDK guide's requests against tfservo, through the real SDK, boto3 and AWS CLI.

Builds a multi-model bundle from code (half_plus_three, the default through
SAGEMAKER_TFS_DEFAULT_MODEL_NAME, and half_plus_two with predict, classify and regress
signatures), with the guide's handler pair in code/inference.py, a code/requirements.txt and a
helper module in code/lib/. Then, with `tfservo.sagemaker_sdk.Session` (no Docker, no AWS):
TensorFlowModel(...).deploy(instance_type='local') and every request form of the guide — TF
Serving JSON, simplified JSON, JSON lines, CSV, classify, regress, a second model by name —
and the AWS CLI's invoke-endpoint forms against the same endpoint.

    .venv/bin/python examples/sagemaker_sdk/run.py [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from example_tools import quiet_tensorflow

INFERENCE = '''\
import json

from convert import csv_to_instances, jsonlines_to_instances  # code/lib/convert.py


def input_handler(data, context):
    """The guide's pre-processing: a TF Serving request passes through; simplified JSON (a
    list), CSV and JSON lines become instances."""
    body = data.read().decode("utf-8")
    if context.request_content_type == "application/json":
        return body if body.lstrip().startswith("{") else json.dumps({"instances": json.loads(body)})
    if context.request_content_type == "text/csv":
        return json.dumps({"instances": csv_to_instances(body)})
    if context.request_content_type == "application/jsonlines":
        return json.dumps({"instances": jsonlines_to_instances(body)})
    raise ValueError(f"unsupported content type {context.request_content_type}")


def output_handler(response, context):
    if response.status_code != 200:
        raise ValueError(response.content.decode("utf-8"))
    return response.content, context.accept_header
'''

CONVERT = '''\
import json


def csv_to_instances(body):
    return [float(v) for line in body.splitlines() for v in line.split(",") if v.strip()]


def jsonlines_to_instances(body):
    return [v for line in body.splitlines() if line.strip() for v in json.loads(line)]
'''


def build(bundle: Path) -> Path:
    """The two models and the code; returns model.tar.gz."""
    quiet_tensorflow()
    import tensorflow as tf
    from build_models import _set_method

    class HalfPlus(tf.Module):
        def __init__(self, b: float) -> None:
            super().__init__()
            self.b = tf.Variable(b)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def predict(self, x):
            return {"y": 0.5 * x + self.b}

        def _x(self, serialized):
            return tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([], tf.float32)})["x"]

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def regress(self, serialized):
            return {"outputs": 0.5 * self._x(serialized) + self.b}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def classify(self, serialized):
            y = 0.5 * self._x(serialized) + self.b
            return {"scores": tf.reshape(y, [-1, 1]), "classes": tf.fill([tf.shape(y)[0], 1], "y")}

    for name, b in (("half_plus_two", 2.0), ("half_plus_three", 3.0)):
        module = HalfPlus(b)
        export = bundle / name / "1"
        signatures = {"serving_default": module.predict.get_concrete_function()}
        if name == "half_plus_two":
            signatures |= {"regress_x_to_y": module.regress.get_concrete_function(),
                           "classify_x_to_y": module.classify.get_concrete_function()}
        tf.saved_model.save(module, str(export), signatures=signatures)
        if name == "half_plus_two":
            _set_method(str(export), "regress_x_to_y", "tensorflow/serving/regress")
            _set_method(str(export), "classify_x_to_y", "tensorflow/serving/classify")
    (bundle / "code" / "lib").mkdir(parents=True, exist_ok=True)
    (bundle / "code" / "inference.py").write_text(INFERENCE)
    (bundle / "code" / "requirements.txt").write_text("requests\n")  # installed already: nothing to fetch
    (bundle / "code" / "lib" / "convert.py").write_text(CONVERT)
    archive = bundle.parent / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for child in sorted(bundle.iterdir()):
            tar.add(child, arcname=child.name)
    return archive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=None)
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="tfservo-sdk-"))
    archive = build(work / "bundle")

    os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    from sagemaker.serializers import CSVSerializer, IdentitySerializer
    from sagemaker.tensorflow import TensorFlowModel, TensorFlowPredictor

    from tfservo.sagemaker_sdk import Session

    session = Session()  # the one changed line: sagemaker.Session() / LocalSession() before
    try:
        model = TensorFlowModel(model_data=f"file://{archive}", role="arn:aws:iam::111111111111:role/SageMakerRole",
                                framework_version="2.12", sagemaker_session=session,
                                env={"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "half_plus_three"})
        predictor = model.deploy(initial_instance_count=1, instance_type="local")
        name = predictor.endpoint_name

        def show(what: str, answer) -> None:
            print(f"{what}: {answer if isinstance(answer, (dict, list)) else answer.decode()}", flush=True)

        show("TF Serving JSON", predictor.predict({"instances": [1.0, 2.0, 5.0]}))
        show("simplified JSON", predictor.predict([1.0, 2.0, 5.0]))
        lines = TensorFlowPredictor(name, session, serializer=IdentitySerializer("application/jsonlines"))
        show("JSON lines", lines.predict(b"[1.0, 2.0]\n[5.0]\n"))
        show("CSV", TensorFlowPredictor(name, session, serializer=CSVSerializer()).predict([1.0, 2.0, 5.0]))
        two = TensorFlowPredictor(name, session, model_name="half_plus_two")
        show("second model by name", two.predict({"instances": [1.0, 2.0, 5.0]}))
        show("classify", two.classify({"signature_name": "classify_x_to_y", "examples": [{"x": 1.0}]}))
        show("regress", two.regress({"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}, {"x": 2.0}]}))

        url = session.control_plane.endpoint_url(name)
        body = work / "input.json"
        body.write_text('{"instances": [1.0, 2.0, 5.0]}')
        regress = work / "regress.json"
        regress.write_text('{"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}]}')
        aws = str(Path(sys.executable).with_name("aws"))
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1"}
        for what, extra in (
            ("AWS CLI, TF Serving JSON", ["--body", f"fileb://{body}", "--content-type", "application/json"]),
            ("AWS CLI, model name and regress", ["--body", f"fileb://{regress}", "--content-type", "application/json",
                                                 "--custom-attributes", "tfs-model-name=half_plus_two,tfs-method=regress"]),
        ):
            out = work / "cli-out.json"
            subprocess.run([aws, "sagemaker-runtime", "invoke-endpoint", "--endpoint-url", url, "--endpoint-name", name,
                            *extra, str(out)], check=True, env=env, stdout=subprocess.DEVNULL)
            show(what, json.loads(out.read_text()))
        predictor.delete_endpoint()
    finally:
        session.close()


if __name__ == "__main__":
    main()
