"""TF Serving's gRPC API on a real `tfservo serve`, called with TF Serving's own Python stubs.

Every answer is checked against the same request over REST on the same server: one runtime,
one behaviour.
"""

from __future__ import annotations

import json
import shutil

import grpc
import numpy as np
import pytest
import tensorflow as tf
from conftest import TFS, grpc_predict_request, tfs_grpc, write_code
from google.protobuf import json_format
from server_process import ServerProcess
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    predict_pb2,
    regression_pb2,
)

M = "saved_model_half_plus_two_2_versions"
MAX_REQUEST_MB = 2

HANDLER = """
    import json

    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc


    def handler(data, context):
        # What SageMaker handlers do with context.channel: call TF Serving's gRPC API.
        xs = json.loads(data.read().decode())
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "saved_model_half_plus_two_2_versions"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(xs, dtype=tf.float32, shape=[len(xs), 1]))
        stub = prediction_service_pb2_grpc.PredictionServiceStub(context.channel)
        response = stub.Predict(request, timeout=30)
        body = {"y": list(response.outputs["y"].float_val), "grpc_uri": context.grpc_uri,
                "grpc_port": context.grpc_port}
        return json.dumps(body), "application/json"
"""


def build_typed_model(path) -> None:
    """A TF2 model with float, int64 and string inputs and three outputs (for output_filter)."""

    class Typed(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.float32, name="x"),
                tf.TensorSpec([None], tf.int64, name="n"),
                tf.TensorSpec([None], tf.string, name="s"),
            ]
        )
        def serve(self, x, n, s):
            return {"doubled": x * 2.0, "next": n + 1, "shout": tf.strings.upper(s)}

    module = Typed()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    bundle = tmp_path_factory.mktemp("grpc-bundle")
    build_typed_model(bundle / "typed" / "1")
    shutil.copytree(TFS / "saved_model_half_plus_two_cpu" / "00000123", bundle / "via_grpc" / "00000123")
    write_code(bundle / "via_grpc" / "code", HANDLER)
    args = [str(TFS / M), str(bundle), "--version-label", f"{M}:stable=123", "--max-request-mb", str(MAX_REQUEST_MB)]
    with ServerProcess(args) as proc:
        assert proc.grpc_target, proc.output
        yield proc


@pytest.fixture(scope="module")
def stubs(server):
    with tfs_grpc(server.grpc_target) as both:
        yield both


@pytest.fixture(scope="module")
def predictions(stubs):
    return stubs[0]


@pytest.fixture(scope="module")
def models(stubs):
    return stubs[1]


@pytest.fixture(scope="module")
def http(server):
    with server.client() as client:
        yield client


def rest(http, path, doc=None):
    r = http.post(path, content=json.dumps(doc)) if doc is not None else http.get(path)
    assert r.status_code == 200, r.text
    return r.json()


def predict_request(xs, name=M, **spec) -> predict_pb2.PredictRequest:
    """For the half_plus_two models: one value per row of x (shape [-1, 1])."""
    return grpc_predict_request(name, np.asarray(xs, np.float32).reshape(-1, 1), **spec)


def add_examples(request, xs, context=None):
    if context is None:
        examples = request.input.example_list.examples
    else:
        listed = request.input.example_list_with_context
        listed.context.features.feature["x"].float_list.value.append(context)
        examples = listed.examples
    for x in xs:
        example = examples.add()
        if x is not None:
            example.features.feature["x"].float_list.value.append(x)
    return request


def error_of(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    return info.value


# -- PredictionService ------------------------------------------------------------------------


def test_predict_gives_the_same_numbers_as_rest(predictions, http):
    response = predictions.Predict(predict_request([1.0, 2.0, 5.0]), timeout=30)
    y = tf.make_ndarray(response.outputs["y"])
    assert rest(http, f"/v1/models/{M}:predict", {"instances": [[1.0], [2.0], [5.0]]}) == {"predictions": y.tolist()}
    assert y.tolist() == [[2.5], [3.0], [4.5]]
    # TF Serving answers in the typed field, which clients read directly.
    assert list(response.outputs["y"].float_val) == [2.5, 3.0, 4.5]
    assert response.model_spec.name == M
    assert response.model_spec.version.value == 124  # the latest version
    assert response.model_spec.signature_name == "serving_default"


def test_predict_accepts_typed_fields_and_a_filling_value(predictions):
    request = predict_request([0.0])
    proto = request.inputs["x"]
    proto.Clear()
    proto.dtype = tf.float32.as_datatype_enum
    proto.tensor_shape.dim.add(size=3)
    proto.tensor_shape.dim.add(size=1)
    proto.float_val.append(4.0)  # one value fills the shape, as in TF
    response = predictions.Predict(request, timeout=30)
    assert tf.make_ndarray(response.outputs["y"]).tolist() == [[4.0], [4.0], [4.0]]


def test_predict_large_tensor_round_trips_exactly(predictions):
    xs = np.random.default_rng(0).standard_normal(200_000).astype(np.float32)
    response = predictions.Predict(predict_request(xs), timeout=60)
    y = tf.make_ndarray(response.outputs["y"]).reshape(-1)
    np.testing.assert_array_equal(y, xs * np.float32(0.5) + np.float32(2.0))


@pytest.mark.parametrize(("version", "label", "served"), [(123, None, 123), (124, None, 124), (None, "stable", 123)])
def test_predict_selects_version_and_label(predictions, http, version, label, served):
    response = predictions.Predict(predict_request([4.0], version=version, label=label), timeout=30)
    assert response.model_spec.version.value == served
    path = f"/v1/models/{M}/versions/{version}:predict" if version else f"/v1/models/{M}/labels/{label}:predict"
    assert rest(http, path, {"instances": [[4.0]]})["predictions"] == tf.make_ndarray(response.outputs["y"]).tolist()


def test_predict_output_filter_and_dtypes(predictions, http):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "typed"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1.5, -2.0], np.float32)))
    request.inputs["n"].CopyFrom(tf.make_tensor_proto(np.array([41, -7], np.int64)))
    request.inputs["s"].CopyFrom(tf.make_tensor_proto([b"abc", "d\u00e9f".encode()]))
    response = predictions.Predict(request, timeout=30)
    assert sorted(response.outputs) == ["doubled", "next", "shout"]
    assert list(response.outputs["next"].int64_val) == [42, -6]
    assert list(response.outputs["shout"].string_val) == [b"ABC", "D\u00e9F".encode()]
    assert tf.make_ndarray(response.outputs["doubled"]).tolist() == [3.0, -4.0]

    request.output_filter.append("next")
    response = predictions.Predict(request, timeout=30)
    assert list(response.outputs) == ["next"]
    assert tf.make_ndarray(response.outputs["next"]).tolist() == [42, -6]
    doc = {"inputs": {"x": [1.5, -2.0], "n": [41, -7], "s": ["abc", "d\u00e9f"]}}
    assert rest(http, "/v1/models/typed:predict", doc)["outputs"]["next"] == [42, -6]

    request.output_filter.append("missing")
    err = error_of(predictions.Predict, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "missing" in err.details() and "doubled" in err.details()


def test_regress_gives_tf_servings_answer_and_rests(predictions, http):
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = M
    request.model_spec.signature_name = "regress_x_to_y"
    response = predictions.Regress(add_examples(request, [80.0]), timeout=30)
    assert [r.value for r in response.result.regressions] == [42.0]
    assert response.model_spec.signature_name == "regress_x_to_y"
    assert response.model_spec.version.value == 124
    doc = {"signature_name": "regress_x_to_y", "examples": [{"x": 80.0}]}
    assert rest(http, f"/v1/models/{M}:regress", doc) == {"results": [42.0]}


def test_regress_with_context_merges_like_rest(predictions, http):
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = M
    request.model_spec.signature_name = "regress_x_to_y2"
    response = predictions.Regress(add_examples(request, [None, 10.0], context=4.0), timeout=30)
    values = [r.value for r in response.result.regressions]
    assert values == [5.0, 8.0]  # y2 = 0.5x + 3; an example's own x wins over the context's
    doc = {"signature_name": "regress_x_to_y2", "context": {"x": 4.0}, "examples": [{}, {"x": 10.0}]}
    assert rest(http, f"/v1/models/{M}:regress", doc)["results"] == values


def test_classify_gives_tf_servings_answer_and_rests(predictions, http):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = M
    request.model_spec.signature_name = "classify_x_to_y"
    response = predictions.Classify(add_examples(request, [20.0]), timeout=30)
    classes = [[(c.label, c.score) for c in cl.classes] for cl in response.result.classifications]
    assert classes == [[("", 12.0)]]
    doc = {"signature_name": "classify_x_to_y", "examples": [{"x": 20.0}]}
    assert rest(http, f"/v1/models/{M}:classify", doc) == {"results": [[["", 12.0]]]}


def test_multi_inference_runs_every_task_on_one_version(predictions):
    request = inference_pb2.MultiInferenceRequest()
    for signature, method in [("classify_x_to_y", "classify"), ("regress_x_to_y2", "regress")]:
        task = request.tasks.add()
        task.model_spec.name = M
        task.model_spec.version.value = 123
        task.model_spec.signature_name = signature
        task.method_name = f"tensorflow/serving/{method}"
    add_examples(request, [20.0, 2.0])
    response = predictions.MultiInference(request, timeout=30)
    first, second = response.results
    assert [cl.classes[0].score for cl in first.classification_result.classifications] == [12.0, 3.0]
    assert [r.value for r in second.regression_result.regressions] == [13.0, 4.0]
    assert [r.model_spec.version.value for r in response.results] == [123, 123]
    assert [r.model_spec.signature_name for r in response.results] == ["classify_x_to_y", "regress_x_to_y2"]

    request.tasks[1].model_spec.signature_name = "classify_x_to_y"
    err = error_of(predictions.MultiInference, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "Duplicate" in err.details()


def test_get_model_metadata_matches_rest(predictions, http):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = M
    response = predictions.GetModelMetadata(request, timeout=30)
    assert response.model_spec.name == M and response.model_spec.version.value == 124
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(sig_map)
    as_json = json_format.MessageToDict(
        sig_map, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    assert as_json == rest(http, f"/v1/models/{M}/metadata")["metadata"]["signature_def"]
    assert sig_map.signature_def["serving_default"].inputs["x"].name == "x:0"


# -- ModelService -----------------------------------------------------------------------------


def test_get_model_status_matches_rest(models, http):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = M
    response = models.GetModelStatus(request, timeout=30)
    assert [(s.version, s.state) for s in response.model_version_status] == [
        (124, get_model_status_pb2.ModelVersionStatus.AVAILABLE),
        (123, get_model_status_pb2.ModelVersionStatus.AVAILABLE),
    ]
    as_json = json_format.MessageToDict(
        response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    assert as_json == rest(http, f"/v1/models/{M}")
    request.model_spec.version.value = 123
    response = models.GetModelStatus(request, timeout=30)
    assert [s.version for s in response.model_version_status] == [123]


def test_reload_config_adds_and_removes_models(models, predictions, http):
    config = model_management_pb2.ReloadConfigRequest()
    entry = config.config.model_config_list.config.add()
    entry.name, entry.base_path, entry.model_platform = "three", str(TFS / "saved_model_half_plus_three"), "tensorflow"
    response = models.HandleReloadConfigRequest(config, timeout=60)
    assert response.status.error_code == 0
    out = predictions.Predict(predict_request([4.0], name="three"), timeout=30)
    assert tf.make_ndarray(out.outputs["y"]).tolist() == [[5.0]]  # y = 0.5x + 3

    config.config.model_config_list.ClearField("config")
    models.HandleReloadConfigRequest(config, timeout=60)
    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = "three"
    assert error_of(models.GetModelStatus, status_request).code() == grpc.StatusCode.NOT_FOUND
    assert http.get("/ping").status_code == 200  # a model the config dropped is not awaited


def test_reload_config_refuses_to_take_over_a_served_name(models):
    config = model_management_pb2.ReloadConfigRequest()
    entry = config.config.model_config_list.config.add()
    entry.name, entry.base_path = M, str(TFS / "saved_model_half_plus_three")
    err = error_of(models.HandleReloadConfigRequest, config)
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS and M in err.details()


# -- errors carry TF Serving's status codes ---------------------------------------------------


def test_unknown_model_is_not_found(predictions, models):
    err = error_of(predictions.Predict, predict_request([1.0], name="nope"))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "nope" in err.details()
    assert f"models served: {M}" in err.details()  # what is served, as the message says
    err = error_of(predictions.Predict, predict_request([1.0], name=M[:-1]))
    assert f"(did you mean {M!r}?)" in err.details()
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "nope"
    assert error_of(models.GetModelStatus, request).code() == grpc.StatusCode.NOT_FOUND
    metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    metadata.model_spec.name = "nope"
    assert error_of(predictions.GetModelMetadata, metadata).code() == grpc.StatusCode.NOT_FOUND


def test_unknown_version_and_label_are_not_found(predictions):
    assert error_of(predictions.Predict, predict_request([1.0], version=7)).code() == grpc.StatusCode.NOT_FOUND
    err = error_of(predictions.Predict, predict_request([1.0], label="canary"))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "canary" in err.details()


def test_bad_inputs_are_invalid_argument(predictions):
    wrong_name = predict_request([1.0])
    wrong_name.inputs["z"].CopyFrom(wrong_name.inputs["x"])
    del wrong_name.inputs["x"]
    err = error_of(predictions.Predict, wrong_name)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "z" in err.details()

    short = predict_request([1.0])
    short.inputs["x"].CopyFrom(tf.make_tensor_proto(np.zeros((3, 1), np.float32)))
    short.inputs["x"].ClearField("tensor_content")
    short.inputs["x"].float_val.extend([1.0, 2.0])  # shape [3, 1] with 2 values
    err = error_of(predictions.Predict, short)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "input 'x'" in err.details()

    strings = predict_request([1.0])
    strings.inputs["x"].CopyFrom(tf.make_tensor_proto([[b"one"]]))
    assert error_of(predictions.Predict, strings).code() == grpc.StatusCode.INVALID_ARGUMENT

    bad_signature = predict_request([1.0], signature_name="nope")
    err = error_of(predictions.Predict, bad_signature)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "serving_default" in err.details()

    no_name = predict_request([1.0], name="")
    assert error_of(predictions.Predict, no_name).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_classify_errors_are_invalid_argument(predictions):
    empty = classification_pb2.ClassificationRequest()
    empty.model_spec.name = M
    empty.model_spec.signature_name = "classify_x_to_y"
    assert error_of(predictions.Classify, empty).code() == grpc.StatusCode.INVALID_ARGUMENT
    wrong_method = add_examples(classification_pb2.ClassificationRequest(), [1.0])
    wrong_method.model_spec.name = M
    wrong_method.model_spec.signature_name = "regress_x_to_y"
    err = error_of(predictions.Classify, wrong_method)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "regress" in err.details()


def test_metadata_needs_signature_def_field(predictions):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = M
    err = error_of(predictions.GetModelMetadata, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "signature_def" in err.details()
    request.metadata_field.append("graph")
    assert error_of(predictions.GetModelMetadata, request).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_request_over_the_size_limit_is_resource_exhausted(predictions):
    too_big = predict_request(np.zeros(MAX_REQUEST_MB * 2**20 // 4 + 1000, np.float32))
    assert error_of(predictions.Predict, too_big).code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# -- handlers reach gRPC through their Context ------------------------------------------------


def test_handler_context_channel_calls_this_servers_grpc_api(server, http):
    r = http.post(
        "/invocations",
        content=b"[1.0, 6.0]",
        headers={"Content-Type": "application/json", "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=via_grpc"},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["y"] == [2.5, 5.0]
    assert body["grpc_uri"] == server.grpc_target
    assert str(body["grpc_port"]) == server.grpc_target.rsplit(":", 1)[1]


def test_bytes_that_are_not_the_request_message_are_invalid_argument(server) -> None:
    """Not INTERNAL: a client's malformed message is the client's mistake (as in TF Serving)."""
    import grpc

    with grpc.insecure_channel(server.grpc_target) as channel:
        for method in ("/tensorflow.serving.PredictionService/Predict", "/tensorflow.serving.ModelService/GetModelStatus"):
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            for junk in (b"\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x12\x05abc"):
                with pytest.raises(grpc.RpcError) as caught:
                    call(junk, timeout=10)
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, junk, caught.value)
                assert "is not a valid tensorflow.serving." in caught.value.details()


@pytest.mark.parametrize("dims", [[0, 2**40, 2**40], [2**31, 2**31, 4], [1, 0, 2**62]])
def test_absurd_dims_are_invalid_argument_not_internal(predictions, server, dims):
    """A client's impossible shape (even beside a 0, which numpy cannot reshape to) is its mistake:
    INVALID_ARGUMENT over TF Serving's Predict, 400 over V2 REST, naming the input."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = M
    request.inputs["x"].dtype = tf.float32.as_datatype_enum
    for d in dims:
        request.inputs["x"].tensor_shape.dim.add(size=d)
    err = error_of(predictions.Predict, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "more elements than any tensor" in err.details()
    with server.client() as client:
        r = client.post(f"/v2/models/{M}/infer", json={"inputs": [{"name": "x", "shape": dims, "datatype": "FP32", "data": []}]})
    assert r.status_code == 400 and "more elements than any tensor" in r.json()["error"], r.text


def _tensor(dtype: int, dims: list[int], **values) -> object:
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2

    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims])
    return tensor_pb2.TensorProto(dtype=dtype, tensor_shape=shape, **values)


@pytest.mark.parametrize(
    ("tensor", "says"),
    [
        (_tensor(tf.variant.as_datatype_enum, [1]), "DT_VARIANT, which tfservo cannot read"),
        (_tensor(999, [1], float_val=[1.0]), "dtype 999"),
        (_tensor(tf.float32.as_datatype_enum, [3], tensor_content=b"\0" * 5), "tensor_content has 5 bytes"),
        (_tensor(tf.float32.as_datatype_enum, [-1], float_val=[1.0]), "unknown (-1) dimension"),
        (_tensor(tf.string.as_datatype_enum, [1], tensor_content=b"abc"), "send its values in string_val"),
        (_tensor(tf.half.as_datatype_enum, [1], half_val=[70000]), "16-bit patterns"),
        (_tensor(tf.complex64.as_datatype_enum, [1], scomplex_val=[1.0]), "real and imaginary"),
        (_tensor(tf.bool.as_datatype_enum, [1], bool_val=[True]), "cannot be converted safely"),
        (_tensor(tf.float32.as_datatype_enum, [100_000_000], float_val=[1.0]), "over the 256 MiB"),
    ],
)
def test_dtype_and_size_mistakes_are_invalid_argument(predictions, tensor, says):
    """Every client mistake in a tensor (dtype, byte count, fill size) says what, never INTERNAL."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = M
    request.inputs["x"].CopyFrom(tensor)
    err = error_of(predictions.Predict, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and says in err.details(), err.details()


def test_v2_tensor_mistakes_are_invalid_argument(server):
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    def infer(datatype, shape, raw=None, **contents):
        request = service_pb2.ModelInferRequest(model_name=M)
        tensor = request.inputs.add(name="x", datatype=datatype, shape=shape)
        for field, values in contents.items():
            getattr(tensor.contents, field).extend(values)
        if raw is not None:
            request.raw_input_contents.append(raw)
        return request

    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for request, says in [
            (infer("FP32", [3], raw=b"\0" * 5), "5 bytes for shape [3]"),
            (infer("FP99", [1], fp32_contents=[1.0]), "datatype 'FP99'"),
            (infer("BYTES", [1], bytes_contents=[b"x"]), "expects DT_FLOAT"),
            (infer("FP32", [-3], fp32_contents=[1.0]), "non-negative"),
        ]:
            err = error_of(stub.ModelInfer, request)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and says in err.details(), err.details()
