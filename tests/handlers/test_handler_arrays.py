"""input_handler returning {"instances": ndarray} / {"inputs": ...}: passed to TF Serving's API
in-process, unserialized, with the same answers and the same checks as the JSON request."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import write_code

from tfservo.codecs import tfs_json as json_codec
from tfservo.core.errors import InvalidArgument
from tfservo.models.signatures import SignatureDef, TensorSpec

INFERENCE_PY = '''
import json
import numpy as np

ROWS = [[1, 2, 3], [250, 0, 7]]

def input_handler(data, context):
    kind = data.read().decode()
    if kind == "json":
        return json.dumps({"instances": ROWS})
    if kind == "uint8":
        return {"instances": np.array(ROWS, np.uint8)}
    if kind == "columnar":
        return {"inputs": {"x": np.array(ROWS, np.float64)}}
    if kind == "bool":
        return {"instances": np.ones((2, 3), bool)}
    raise ValueError(kind)

def output_handler(response, context):
    return response.content, "application/json"
'''


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    import tensorflow as tf

    from tfservo.service.factory import ModelService

    root = tmp_path_factory.mktemp("arrays") / "double"

    class Double(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def serve(self, x):
            return {"y": x * 2.0}

    module = Double()
    tf.saved_model.save(module, str(root / "1"), signatures={"serving_default": module.serve.get_concrete_function()})
    write_code(root / "code", INFERENCE_PY)
    svc = ModelService()
    svc.add_bundle(str(root))
    yield svc
    svc.close()


def test_arrays_answer_exactly_as_their_json(service):
    via_json = service.invoker.invoke(b"json", "text/plain")
    assert via_json.status == 200, via_json.body
    assert via_json.body == service.invoker.invoke(b"uint8", "text/plain").body
    columnar = service.invoker.invoke(b"columnar", "text/plain")
    assert columnar.status == 200, columnar.body
    import json

    assert json.loads(columnar.body) == {"outputs": [[2.0, 4.0, 6.0], [500.0, 0.0, 14.0]]}


def test_array_of_the_wrong_kind_is_a_clear_error(service):
    result = service.invoker.invoke(b"bool", "text/plain")  # output_handler passes TF Serving's 400 body on
    assert '"error"' in result.body.decode()
    assert "numpy array of bool" in result.body.decode() and "Input x" in result.body.decode()


SIG = SignatureDef(
    name="serving_default",
    method_name="tensorflow/serving/predict",
    inputs={"x": TensorSpec(key="x", tensor_name="x:0", dtype="DT_FLOAT", shape=(-1, 3))},
    outputs={},
)


def test_codec_casts_and_checks_arrays_like_json():
    req = json_codec.decode_predict_request({"instances": np.arange(6, dtype=np.int64).reshape(2, 3)}, lambda _: SIG)
    assert req.inputs["x"].dtype == np.float32 and req.row_format
    assert req.inputs["x"].tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(InvalidArgument, match="do not fit float"):  # > 2**24: float32 would round it
        json_codec.decode_predict_request({"instances": np.full((1, 3), 2**25, np.int64)}, lambda _: SIG)
    with pytest.raises(InvalidArgument, match="do not fit float"):
        json_codec.decode_predict_request({"inputs": np.full((1, 3), 1e39)}, lambda _: SIG)
    nan = json_codec.decode_predict_request({"inputs": np.full((1, 3), np.nan)}, lambda _: SIG)
    assert np.isnan(nan.inputs["x"]).all()  # as JSON's NaN is accepted
