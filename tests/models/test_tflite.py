"""TFLite models served as TF Serving serves them: a version dir holding model.tflite (converted
from code here), beside or instead of a SavedModel, over REST, gRPC and V2, with metadata and
status; --prefer-tflite-model picks it over the SavedModel of the same dir."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tensorflow as tf
from conftest import grpc_predict_request, tfs_grpc
from server_process import ServerProcess


def _save(root, fn, saved_model: bool, tflite) -> None:
    """Export y = fn(x) (x: float32 [-1, 1]) as a SavedModel and/or `tflite`'s conversion."""

    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def serve(self, x):
            return {"y": fn(x)}

    module = Module()
    staging = root.parent / f"{root.name}-staging"
    tf.saved_model.save(module, str(staging), signatures={"serving_default": module.serve.get_concrete_function()})
    root.mkdir(parents=True)
    if saved_model:
        staging.rename(root / "sm")
        for item in (root / "sm").iterdir():
            item.rename(root / item.name)
        (root / "sm").rmdir()
    if tflite is not None:
        _save_tflite(root, tflite)


def _save_tflite(root, fn) -> None:
    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def serve(self, x):
            return {"y": fn(x)}

    module = Module()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.serve.get_concrete_function()], module)
    (root / "model.tflite").write_bytes(converter.convert())


def _plus_one(x):
    return x + 1.0


def _plus_hundred(x):
    return x + 100.0


def _twice(x):
    return x * 2.0


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """both/1: a SavedModel (x + 1) and a model.tflite (x + 100); lite/1: only model.tflite (2x)."""
    base = tmp_path_factory.mktemp("tflite")
    _save(base / "both" / "1", _plus_one, saved_model=True, tflite=_plus_hundred)
    lite = base / "lite" / "1"
    lite.mkdir(parents=True)
    _save_tflite(lite, _twice)
    return base


@pytest.fixture(scope="module")
def server(models):
    with ServerProcess([str(models / "both"), str(models / "lite")]) as proc:
        yield proc


def test_a_tflite_only_version_is_served_on_every_door(server):
    with server.client() as http:
        got = http.post("/v1/models/lite:predict", json={"instances": [[1.0], [2.5]]})
        assert got.json() == {"predictions": [[2.0], [5.0]]}, got.text
        status = http.get("/v1/models/lite").json()
        assert status["model_version_status"][0]["state"] == "AVAILABLE"
        signature = http.get("/v1/models/lite/metadata").json()["metadata"]["signature_def"]["signature_def"]
        default = signature["serving_default"]
        assert default["method_name"] == "tensorflow/serving/predict"
        assert default["inputs"]["x"]["dtype"] == "DT_FLOAT"
        assert [int(d["size"]) for d in default["inputs"]["x"]["tensor_shape"]["dim"]] == [-1, 1]
        v2 = http.post("/v2/models/lite/infer", json={"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [3.0]}]})
        assert v2.json()["outputs"][0]["data"] == [6.0], v2.text
        bad = http.post("/v1/models/lite:predict", json={"instances": [["text"]]})
        assert bad.status_code == 400 and "error" in bad.json()
        # the SavedModel wins in a dir holding both, as in TF Serving without --prefer_tflite_model
        assert http.post("/v1/models/both:predict", json={"instances": [[1.0]]}).json() == {"predictions": [[2.0]]}
    with tfs_grpc(server.grpc_target) as (predict, _):
        answer = predict.Predict(grpc_predict_request("lite", np.array([[4.0]], np.float32)), timeout=30)
        assert list(answer.outputs["y"].float_val) == [8.0]
        strings = grpc_predict_request("lite", np.array([[4.0]], np.float32))
        strings.inputs["x"].CopyFrom(tf.make_tensor_proto([[b"four"]]))
        with pytest.raises(grpc.RpcError) as caught:
            predict.Predict(strings, timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_interpreters_own_errors_are_invalid_argument_naming_the_signature(tmp_path):
    """Shapes TFLite cannot run (two inputs that do not broadcast) are the caller's mistake."""
    from tfservo.core.errors import InvalidArgument
    from tfservo.models.tflite import load_tflite_model

    class Pair(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="a"),
                                      tf.TensorSpec([None, 2], tf.float32, name="b")])
        def serve(self, a, b):
            return {"sum": a + b}

    module = Pair()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.serve.get_concrete_function()], module)
    (tmp_path / "model.tflite").write_bytes(converter.convert())
    model = load_tflite_model(str(tmp_path), interpreters=2)
    try:
        got = model.run("serving_default", {"a": np.ones((2, 2), np.float32), "b": np.ones((2, 2), np.float32)})
        assert got["sum"].tolist() == [[2.0, 2.0], [2.0, 2.0]]
        with pytest.raises(InvalidArgument, match="while running TFLite signature 'serving_default'.*expected inputs: a float32"):
            model.run("serving_default", {"a": np.ones((1, 2), np.float32), "b": np.ones((1, 3), np.float32)})
    finally:
        model.close()


def test_prefer_tflite_model_serves_the_tflite_model_of_a_dir_holding_both(models):
    with ServerProcess([str(models / "both"), "--prefer-tflite-model"]) as proc:
        with proc.client() as http:
            assert http.post("/v1/models/both:predict", json={"instances": [[1.0]]}).json() == {"predictions": [[101.0]]}


def test_signature_defs_stored_in_the_models_metadata_name_its_inputs(tmp_path):
    """A TFLite model without signature runners (TF1's converter) whose SignatureDefs TF Serving's
    tooling stored in `signature_defs_metadata`: requests use the SignatureDef's keys ("x"),
    fed to the tensors they name, at any batch rank, as TF Serving feeds them."""
    from flatbuffers import flexbuffers
    from tensorflow.core.protobuf import meta_graph_pb2
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    from tfservo.models.tflite import load_tflite_model

    _save_tflite(tmp_path, _twice)
    model = flatbuffer_utils.read_model(str(tmp_path / "model.tflite"))
    model.signatureDefs = []  # as TF1's converter wrote them: tensors only
    graph = model.subgraphs[0]
    tensor_in = graph.tensors[graph.inputs[0]].name.decode()
    tensor_out = graph.tensors[graph.outputs[0]].name.decode()
    signature = meta_graph_pb2.SignatureDef(method_name="tensorflow/serving/predict")
    signature.inputs["x"].name = f"{tensor_in}:0"
    signature.outputs["y"].name = f"{tensor_out}:0"
    buffer = schema.BufferT()
    buffer.data = list(flexbuffers.Dumps({"serving_default": signature.SerializeToString()}))
    model.buffers.append(buffer)
    metadata = schema.MetadataT()
    metadata.name, metadata.buffer = b"signature_defs_metadata", len(model.buffers) - 1
    model.metadata = [*(model.metadata or []), metadata]
    flatbuffer_utils.write_model(model, str(tmp_path / "model.tflite"))

    loaded = load_tflite_model(str(tmp_path))
    try:
        assert {name: (list(s.inputs), list(s.outputs)) for name, s in loaded.signatures.items()} == {
            "serving_default": (["x"], ["y"])
        }
        assert loaded.run("serving_default", {"x": np.array([[1.5], [2.0]], np.float32)})["y"].tolist() == [[3.0], [4.0]]
        assert loaded.run("serving_default", {"x": np.array([2.0], np.float32)})["y"].tolist() == [4.0]
    finally:
        loaded.close()
