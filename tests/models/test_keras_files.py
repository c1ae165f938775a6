"""Keras 3 `.keras` files served as they are saved: a version dir holding model.keras, on every
door (SageMaker, TF Serving REST and gRPC, V2), in archives and multi-model roots, through
`invoke`, `inspect`, `transform` and Beam, with answers equal to Keras's own; and loaded safely:
what would run code or read files on load is refused, naming the layer and how to allow it."""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import grpc_predict_request, tfs_grpc
from keras_models import build_keras_models, rewrite_config
from server_process import ServerProcess, run_cli


@pytest.fixture(scope="module")
def keras_models(tmp_path_factory):
    return build_keras_models(tmp_path_factory.mktemp("keras"))


@pytest.fixture(scope="module")
def server(keras_models):
    models = [str(keras_models.dir(name)) for name in ("mlp", "pair", "words", "doubled", "scaled")]
    with ServerProcess([*models, "--no-supervisor"], env={"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "mlp"}) as proc:
        yield proc


def test_a_keras_file_answers_as_keras_does_on_every_door(keras_models, server):
    k = keras_models
    with server.client() as http:
        got = http.post("/invocations", json={"instances": k.mlp_x.tolist()})
        assert got.status_code == 200, got.text
        np.testing.assert_allclose(got.json()["predictions"], k.mlp_y, rtol=1e-5, atol=1e-6)

        pair = http.post("/v1/models/pair:predict", json={"inputs": {key: v.tolist() for key, v in k.pair_in.items()}})
        assert pair.status_code == 200, pair.text
        for key, want in k.pair_out.items():
            np.testing.assert_allclose(pair.json()["outputs"][key], want, rtol=1e-5, atol=1e-6)

        v2 = http.post("/v2/models/pair/infer", json={"inputs": [
            {"name": key, "shape": list(v.shape), "datatype": "FP32", "data": v.ravel().tolist()}
            for key, v in k.pair_in.items()]})
        assert v2.status_code == 200, v2.text
        outputs = {o["name"]: o for o in v2.json()["outputs"]}
        np.testing.assert_allclose(outputs["klass"]["data"], k.pair_out["klass"].ravel(), rtol=1e-5, atol=1e-6)
        assert outputs["score"]["shape"] == [1, 1]

        words = http.post("/v1/models/words:predict", json={"instances": [[w] for w in k.words_in]})
        assert words.json() == {"predictions": k.words_out.tolist()}, words.text  # purple: out of vocabulary

        # the signature is Keras's own export's: inputs by the input layers' names
        meta = http.get("/v1/models/pair/metadata").json()["metadata"]["signature_def"]["signature_def"]
        default = meta["serving_default"]
        assert sorted(default["inputs"]) == ["age", "income"] and sorted(default["outputs"]) == ["klass", "score"]
        assert default["method_name"] == "tensorflow/serving/predict"
        assert http.get("/v1/models/mlp").json()["model_version_status"][0]["state"] == "AVAILABLE"
    # served without warnings a user has to read (Keras's own or TensorFlow's)
    assert not [line for line in server.lines if " WARNING " in line or line.startswith("W0000")], server.output
    with tfs_grpc(server.grpc_target) as (predict, _):
        answer = predict.Predict(grpc_predict_request("mlp", k.mlp_x), timeout=30)
        np.testing.assert_allclose(np.array(answer.outputs["output_0"].float_val).reshape(2, 2), k.mlp_y, rtol=1e-5)


def test_classify_and_regress_on_a_keras_file_say_why_they_cannot(server):
    with server.client() as http:
        for method in ("classify", "regress"):
            got = http.post(f"/v1/models/mlp:{method}", json={"examples": [{"x": [1.0, 2.0, 3.0, 4.0]}]})
            assert got.status_code == 400, got.text
            error = got.json()["error"]
            assert f"{method} of model mlp version 1: it is served from the Keras file model.keras" in error
            assert "Send its inputs to :predict" in error


def test_a_lambda_layer_is_refused_naming_it_and_the_flag_then_served_when_trusted(keras_models, server):
    with server.client() as http:
        status = http.get("/v1/models/doubled").json()["model_version_status"][0]
        assert status["state"] == "END"
        message = status["status"]["error_message"]
        assert "layer 'double': a Lambda layer" in message and "--trust-model-code" in message, message
        refused = http.post("/v1/models/doubled:predict", json={"instances": [[1.0, 2.0, 3.0]]})
        assert refused.status_code in (400, 404, 503) and "error" in refused.json()
    with ServerProcess([str(keras_models.dir("doubled")), "--no-supervisor", "--trust-model-code"]) as trusted, \
            trusted.client() as http:
        got = http.post("/v1/models/doubled:predict", json={"instances": [[1.0, 2.0, 3.0]]})
        assert got.json() == {"predictions": [[2.0, 4.0, 6.0]]}, got.text


def test_a_custom_layer_loads_where_the_bundles_code_registers_it_and_is_named_where_nothing_does(
        keras_models, server):
    with server.client() as http:
        got = http.post("/v1/models/scaled:predict", json={"instances": [[1.0, 2.0, 3.0]]})
        assert got.json() == {"predictions": [[3.0, 6.0, 9.0]]}, got.text
    # a server of its own: the shared one imported scaled's code, which registered the class there
    with ServerProcess([str(keras_models.dir("scaled_bare")), "--no-supervisor"]) as bare, bare.client() as http:
        status = http.get("/v1/models/scaled_bare").json()["model_version_status"][0]
        message = status["status"]["error_message"]
        assert status["state"] == "END" and "layer 'scale': class mine>Scale from module keras_models, outside Keras, which nothing here registered" in message
        assert "register_keras_serializable" in message and "--trust-model-code" not in message, message


def test_an_edited_config_that_names_code_or_files_is_refused_before_keras_reads_it(keras_models, tmp_path):
    from tfservo.core.errors import ModelLoadError
    from tfservo.models.keras_model import keras_findings, load_keras_model

    source = keras_models.dir("words") / "1" / "model.keras"

    def vocabulary_path(config):
        for layer in config["config"]["layers"]:
            if layer["class_name"] == "StringLookup":
                layer["config"]["vocabulary"] = "/etc/passwd"
        return config

    def os_module(config):  # CVE-2025-1550's shape: a class named by a module outside Keras
        config["config"]["layers"][1].update({"module": "os", "class_name": "system", "registered_name": None})
        return config

    rewrite_config(source, tmp_path / "vocab" / "1" / "model.keras", vocabulary_path)
    rewrite_config(source, tmp_path / "os" / "1" / "model.keras", os_module)
    (found,) = keras_findings(str(tmp_path / "vocab" / "1" / "model.keras"))
    assert found.layer == "lookup" and "'/etc/passwd'" in found.what
    for name, expected, flag in (("vocab", "vocabulary is the path '/etc/passwd'", True),
                                 ("os", "class system from module os, outside Keras", False)):
        with pytest.raises(ModelLoadError, match="Refusing to load") as caught:
            load_keras_model(str(tmp_path / name / "1"), str(tmp_path / name / "1" / "model.keras"))
        assert expected in caught.value.message, caught.value.message
        assert ("--trust-model-code" in caught.value.message) is flag, caught.value.message
    (tmp_path / "junk" / "1").mkdir(parents=True)
    (tmp_path / "junk" / "1" / "model.keras").write_bytes(b"not a zip")
    with pytest.raises(ModelLoadError, match="not a readable .keras file"):
        load_keras_model(str(tmp_path / "junk" / "1"), str(tmp_path / "junk" / "1" / "model.keras"))


def test_archives_multi_model_roots_invoke_and_inspect_serve_keras_files(keras_models, tmp_path):
    k = keras_models
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(k.dir("mlp") / "1", arcname="1")
    done = run_cli(["invoke", str(archive)], input=json.dumps({"instances": k.mlp_x.tolist()}).encode())
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    np.testing.assert_allclose(json.loads(done.stdout)["predictions"], k.mlp_y, rtol=1e-5, atol=1e-6)

    shown = run_cli(["inspect", str(k.dir("pair"))])
    assert shown.returncode == 0 and "age" in shown.stdout.decode() and "klass" in shown.stdout.decode(), shown

    root = tmp_path / "root"
    shutil.copytree(k.dir("pair"), root / "pair")
    with ServerProcess(["--multi-model", "--model-root", str(root), "--no-supervisor"]) as mme, mme.client() as http:
        loaded = http.post("/models", json={"model_name": "pair", "url": str(root / "pair")})
        assert loaded.status_code == 200, loaded.text
        got = http.post("/models/pair/invoke", json={"inputs": {key: v.tolist() for key, v in k.pair_in.items()}})
        assert got.status_code == 200, got.text
        np.testing.assert_allclose(got.json()["outputs"]["score"], k.pair_out["score"], rtol=1e-5, atol=1e-6)


def test_transform_and_beam_run_a_keras_file(keras_models, tmp_path):
    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference
    from apache_beam.testing.util import assert_that, equal_to

    from tfservo.beam import BundleModelHandler

    k = keras_models
    source = tmp_path / "in"
    source.mkdir()
    (source / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in k.mlp_x.tolist()))
    done = run_cli(["transform", str(k.dir("mlp")), str(source), str(tmp_path / "out"), "--split-type", "Line",
                    "--content-type", "application/jsonlines", "--progress", "none"])
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    got = json.loads((tmp_path / "out" / "rows.jsonl.out").read_text())["predictions"]  # one mini-batch
    np.testing.assert_allclose(got, k.mlp_y, rtol=1e-5, atol=1e-6)

    def rounded(values) -> tuple[float, ...]:
        return tuple(np.round(np.asarray(values, np.float64), 4).tolist())

    with beam.Pipeline() as pipeline:
        got = (pipeline | beam.Create(list(k.mlp_x)) | RunInference(BundleModelHandler(str(k.dir("mlp"))))
               | beam.Map(lambda r: (rounded(r.example), rounded(r.inference["output_0"]))))
        assert_that(got, equal_to([(rounded(x), rounded(y)) for x, y in zip(k.mlp_x, k.mlp_y)]))


def test_a_new_keras_version_is_polled_in_and_s3_prefixes_serve_keras_files(keras_models, tmp_path, s3_endpoint,
                                                                           s3_bucket):
    from s3_server import upload_dir

    k = keras_models
    model = tmp_path / "mlp"
    shutil.copytree(k.dir("mlp"), model)
    with ServerProcess([str(model), "--no-supervisor", "--file-system-poll-wait-seconds", "1"]) as proc, \
            proc.client() as http:
        shutil.copytree(model / "1", model / "2")
        deadline = time.monotonic() + 60
        while "AVAILABLE" not in http.get("/v1/models/mlp/versions/2").text:
            assert time.monotonic() < deadline, proc.output
            time.sleep(0.5)
        got = http.post("/v1/models/mlp/versions/2:predict", json={"instances": k.mlp_x.tolist()})
        assert got.status_code == 200, got.text
        np.testing.assert_allclose(got.json()["predictions"], k.mlp_y, rtol=1e-5, atol=1e-6)

    url = upload_dir(s3_endpoint, s3_bucket, "keras/pair", k.dir("pair"))
    with ServerProcess([url, "--no-supervisor"]) as proc, proc.client() as http:
        got = http.post("/v1/models/pair:predict", json={"inputs": {key: v.tolist() for key, v in k.pair_in.items()}})
        assert got.status_code == 200, got.text
        np.testing.assert_allclose(got.json()["outputs"]["klass"], k.pair_out["klass"], rtol=1e-5, atol=1e-6)


def test_export_writes_a_savedmodel_tensorflow_model_server_answers_as_serve_answers_the_keras_file(
        keras_models, server, tmp_path):
    import tensorflow as tf

    k = keras_models
    done = run_cli(["export", str(k.dir("pair") / "1"), str(tmp_path / "pair" / "1")])
    assert done.returncode == 0, done.stderr.decode()
    report = done.stdout.decode()
    assert "input  age: float32 (-1, 3)" in report and "output klass: max |diff|" in report, report
    assert "tolerance |keras - savedmodel| <= 1e-05 + 1e-05·|keras|" in report and "OUTSIDE" not in report, report
    # a plain SavedModel with Keras's signature: what TF Serving's own loader reads
    signature = tf.saved_model.load(str(tmp_path / "pair" / "1")).signatures["serving_default"]
    assert sorted(signature.structured_input_signature[1]) == ["age", "income"]

    body = {"inputs": {key: v.tolist() for key, v in k.pair_in.items()}}
    with server.client() as http:
        from_keras = http.post("/v1/models/pair:predict", json=body).json()["outputs"]
    tfms = ServerProcess([])
    tfms.args = [str(Path(sys.executable).with_name("tensorflow_model_server")), "--port=0", "--rest_api_port=0",
                 "--model_name=pair", f"--model_base_path={tmp_path / 'pair'}"]
    with tfms, tfms.client() as http:
        from_export = http.post("/v1/models/pair:predict", json=body)
        assert from_export.status_code == 200, from_export.text
    for key in ("klass", "score"):
        np.testing.assert_allclose(from_export.json()["outputs"][key], from_keras[key], rtol=1e-6, atol=1e-7)


def test_export_refuses_what_load_refuses_and_writes_nothing_it_has_not_checked(keras_models, tmp_path):
    k = keras_models
    refused = run_cli(["export", str(k.dir("doubled") / "1" / "model.keras"), str(tmp_path / "d" / "1")])
    assert refused.returncode == 1 and "layer 'double': a Lambda layer" in refused.stderr.decode()
    assert "--trust-model-code (serve, export)" in refused.stderr.decode()
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())
    trusted = run_cli(["export", "--trust-model-code", str(k.dir("doubled") / "1"), str(tmp_path / "d" / "1")])
    assert trusted.returncode == 0, trusted.stderr.decode()
    again = run_cli(["export", str(k.dir("mlp") / "1"), str(tmp_path / "d" / "1")])
    assert again.returncode == 1 and "already exists" in again.stderr.decode()
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["1"]  # no staging dir left beside it
    nothing = run_cli(["export", str(tmp_path), str(tmp_path / "e" / "1")])
    assert nothing.returncode == 1 and "is not a .keras file or a version dir holding one" in nothing.stderr.decode()
