"""TF2 exports classify and regress as TF Serving does: `tf.saved_model.save` marks every
signature tensorflow/serving/predict, and TF Serving checks a signature's method_name only under
--enable_signature_method_name_check (default off). REST, gRPC Classify/Regress and
MultiInference, with the check off (results) and on (INVALID_ARGUMENT)."""

from __future__ import annotations

import grpc
import pytest
from server_process import ServerProcess

from tfservo.models.signatures import PREDICT_METHOD


def _export(path):
    import tensorflow as tf

    class Scorer(tf.Module):
        def _x(self, inputs):
            return tf.io.parse_example(inputs, {"x": tf.io.FixedLenFeature([1], tf.float32)})["x"]

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def classify(self, inputs):
            x = self._x(inputs)
            classes = tf.tile(tf.constant([["high", "low"]]), [tf.shape(x)[0], 1])
            return {"classes": classes, "scores": tf.concat([x, 1.0 - x], axis=1)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def regress(self, inputs):
            return {"outputs": self._x(inputs)[:, 0] * 2.0}

    module = Scorer()
    tf.saved_model.save(module, str(path / "scorer" / "1"), signatures={
        "serving_default": module.regress, "classify_it": module.classify, "regress_it": module.regress,
    })
    return path / "scorer"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("tf2"))


@pytest.fixture(scope="module", params=[False, True], ids=["check off", "check on"])
def served(request, model):
    args = [str(model)] + (["--enable-signature-method-name-check"] if request.param else [])
    server = ServerProcess(args).start()
    yield request.param, server
    server.stop()


def _example(x: float):
    from tensorflow.core.example import example_pb2

    example = example_pb2.Example()
    example.features.feature["x"].float_list.value.append(x)
    return example


def test_the_export_marks_every_signature_predict(model):
    from tfservo.models.savedmodel import load_saved_model

    loaded = load_saved_model(str(model / "1"))
    assert {sig.method_name for sig in loaded.signatures.values()} == {PREDICT_METHOD}


def test_rest_classify_and_regress(served):
    check, server = served
    body = {"examples": [{"x": 0.25}, {"x": 0.5}]}
    with server.client() as client:
        classify = client.post("/v1/models/scorer:classify", json={"signature_name": "classify_it", **body})
        regress = client.post("/v1/models/scorer:regress", json={"signature_name": "regress_it", **body})
    if check:
        assert classify.status_code == 400 and "method_name" in classify.json()["error"]
        assert regress.status_code == 400 and "method_name" in regress.json()["error"]
        return
    assert classify.status_code == 200, classify.text
    assert classify.json() == {"results": [[["high", 0.25], ["low", 0.75]], [["high", 0.5], ["low", 0.5]]]}
    assert regress.status_code == 200, regress.text
    assert regress.json() == {"results": [0.5, 1.0]}


def test_grpc_classify_regress_and_multi_inference(served):
    from tensorflow_serving.apis import (
        classification_pb2,
        inference_pb2,
        prediction_service_pb2_grpc,
        regression_pb2,
    )

    check, server = served
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        classify = classification_pb2.ClassificationRequest()
        classify.model_spec.name, classify.model_spec.signature_name = "scorer", "classify_it"
        classify.input.example_list.examples.extend([_example(0.25)])
        regress = regression_pb2.RegressionRequest()
        regress.model_spec.name, regress.model_spec.signature_name = "scorer", "regress_it"
        regress.input.example_list.examples.extend([_example(0.25), _example(0.5)])
        multi = inference_pb2.MultiInferenceRequest()
        multi.input.example_list.examples.extend([_example(0.5)])
        for signature, method in (("classify_it", "tensorflow/serving/classify"), ("regress_it", "tensorflow/serving/regress")):
            task = multi.tasks.add()
            task.model_spec.name, task.model_spec.signature_name, task.method_name = "scorer", signature, method
        if check:
            for call, request in ((stub.Classify, classify), (stub.Regress, regress), (stub.MultiInference, multi)):
                with pytest.raises(grpc.RpcError) as failed:
                    call(request, timeout=30)
                assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "method_name" in failed.value.details()
            return
        classes = stub.Classify(classify, timeout=30).result.classifications[0].classes
        assert [(c.label, round(c.score, 4)) for c in classes] == [("high", 0.25), ("low", 0.75)]
        assert [r.value for r in stub.Regress(regress, timeout=30).result.regressions] == [0.5, 1.0]
        results = stub.MultiInference(multi, timeout=30).results
        assert [(c.label, c.score) for c in results[0].classification_result.classifications[0].classes] == [
            ("high", 0.5), ("low", 0.5)]
        assert [r.value for r in results[1].regression_result.regressions] == [1.0]


def test_pipeline_adapters_classify_and_regress_a_tf2_export(model):
    """The in-process adapters select methods as the server does: with the check off (their
    default, as serve's), classify and regress run on the TF2 export's signatures."""
    import numpy as np

    from tfservo.ray import BundlePredictor

    examples = np.array([_example(0.25).SerializeToString(), _example(0.5).SerializeToString()], dtype=object)
    classify = BundlePredictor(str(model), signature_name="classify_it", method="classify")
    out = classify({"examples": examples, "id": np.array(["a", "b"])})
    assert out["classes"].tolist() == [["high", "low"], ["high", "low"]]
    assert out["id"].tolist() == ["a", "b"]
    regress = BundlePredictor(str(model), signature_name="regress_it", method="regress")
    assert regress({"examples": examples})["value"].tolist() == [0.5, 1.0]
