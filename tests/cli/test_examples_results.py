"""JSON examples → tf.train.Example bytes, and classify/regress outputs → TF Serving results."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tfservo.codecs import tfs_json as json_codec
from tfservo.codecs.examples import build_examples
from tfservo.codecs.results import (
    check_classify_signature,
    check_regress_signature,
    classification_result_proto,
    classification_results,
    regression_result_proto,
    regression_results,
)
from tfservo.core.errors import InvalidArgument
from tfservo.models.signatures import (
    CLASSIFY_METHOD,
    PREDICT_METHOD,
    REGRESS_METHOD,
    SignatureDef,
    TensorSpec,
)

example_pb2 = pytest.importorskip("tensorflow.core.example.example_pb2")


def parse(serialized: bytes) -> dict[str, tuple[str | None, list]]:
    """feature → (kind, values) of a serialized tf.train.Example."""
    example = example_pb2.Example.FromString(serialized)
    out: dict[str, tuple[str | None, list]] = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = (kind, list(getattr(feature, kind).value) if kind else [])
    return out


def error_of(examples: list, context: dict | None = None, types: dict | None = None) -> str:
    with pytest.raises(InvalidArgument) as info:
        build_examples(examples, context, types)
    return info.value.message


# -- build_examples ----------------------------------------------------------------------------


def test_json_types_become_feature_kinds() -> None:
    (ex,) = build_examples(
        [
            {
                "names": ["foo", "bar"],
                "ratings": [8.0, 9.5],
                "age": 20,
                "neg": [-1, -(2**63)],
                "img": {"b64": "aGVsbG8="},
                "mixed": ["baz", {"b64": "aGVsbG8="}],
                "intboolmix": [1, True, False],
                "empty": [],
                "text": "é",
            }
        ],
        None,
    )
    assert parse(ex) == {
        "names": ("bytes_list", [b"foo", b"bar"]),
        "ratings": ("float_list", [8.0, 9.5]),
        "age": ("int64_list", [20]),
        "neg": ("int64_list", [-1, -(2**63)]),
        "img": ("bytes_list", [b"hello"]),
        "mixed": ("bytes_list", [b"baz", b"hello"]),
        "intboolmix": ("int64_list", [1, 1, 0]),
        "empty": (None, []),
        "text": ("bytes_list", ["é".encode()]),
    }


def test_non_finite_floats() -> None:
    doc = json_codec.parse_json(b'{"examples": [{"r": [8.0, NaN, Infinity, -Infinity]}]}')
    (ex,) = build_examples(doc["examples"], None)
    kind, values = parse(ex)["r"]
    assert kind == "float_list" and values[0] == 8.0 and math.isnan(values[1]) and values[2:] == [
        math.inf,
        -math.inf,
    ]


def test_context_is_merged_and_example_wins() -> None:
    examples = build_examples([{"x": 80.0}, {"x2": 4.0}, {}], {"x": 1.0, "q": "pizza"})
    assert parse(examples[0]) == {"x": ("float_list", [80.0]), "q": ("bytes_list", [b"pizza"])}
    assert parse(examples[1]) == {
        "x": ("float_list", [1.0]),
        "x2": ("float_list", [4.0]),
        "q": ("bytes_list", [b"pizza"]),
    }
    assert parse(examples[2]) == {"x": ("float_list", [1.0]), "q": ("bytes_list", [b"pizza"])}


def test_context_kind_can_be_replaced_by_example() -> None:
    (ex,) = build_examples([{"x": 3}], {"x": "three"})
    assert parse(ex) == {"x": ("int64_list", [3])}


def test_feature_types_turn_integers_into_floats() -> None:
    types = {"x": "float", "y": "float", "c": "float"}
    (ex,) = build_examples([{"x": 20, "y": [1, 2.5, True], "n": 7}], {"c": 5}, types)
    assert parse(ex) == {
        "x": ("float_list", [20.0]),
        "y": ("float_list", [1.0, 2.5, 1.0]),
        "n": ("int64_list", [7]),
        "c": ("float_list", [5.0]),
    }


def test_empty_example_without_context() -> None:
    assert build_examples([{}], None) == [b""]


@pytest.mark.parametrize(
    ("examples", "context", "types", "needle"),
    [
        ([{"x": 1}, {"names": [10, None]}], None, None,
         "element: 1 of 'examples' list. Error: Feature: names has element with unexpected JSON type: Null"),
        ([{"names": [10, 10.0]}], None, None, "element type in feature: names expecting type: int64"),
        ([{"names": [10, {"test": 10}]}], None, None, "names has element with unexpected JSON type: Object"),
        ([{"names": [[10], 20]}], None, None, "names has element with unexpected JSON type: Array"),
        ([{"names": [20, 18446744073709551603]}], None, None, "Only int64 is supported"),
        ([{"names": 1.7976931348623157e308}], None, None, "loss of precision"),
        ([{"x": 16777217}], None, {"x": "float"}, "16777217 to float without loss of precision"),
        ([{"x": "a"}, {"x": ["a", 1]}], None, None, "element: 1 of 'examples' list"),
        ([{"x": {"b64": "!!"}}], None, None, "Unable to base64 decode"),
        ([{}], {"q": None}, None, "Failed to process 'context' object. Error: Feature: q has element"),
        ([[1]], None, None, "element: 0 of 'examples' list. Error: Example must be JSON object but got"),
    ],
)
def test_invalid_features_name_example_and_feature(
    examples: list, context: dict | None, types: dict | None, needle: str
) -> None:
    assert needle in error_of(examples, context, types)


def test_matches_example_pb2_serialization() -> None:
    expected = example_pb2.Example()
    feature = expected.features.feature
    feature["a"].float_list.value.extend([1.5, -2.25])
    feature["b"].int64_list.value.extend([0, 300, -5])
    feature["c"].bytes_list.value.extend([b"", b"x" * 200])
    (ex,) = build_examples([{"a": [1.5, -2.25], "b": [0, 300, -5], "c": ["", "x" * 200]}], None)
    assert example_pb2.Example.FromString(ex) == expected


# -- classification_results / regression_results -----------------------------------------------


def classify_sig(*outputs: str) -> SignatureDef:
    return SignatureDef(
        "classify_x_to_y",
        CLASSIFY_METHOD,
        {"inputs": TensorSpec("inputs", "tf_example:0", "DT_STRING", None)},
        {k: TensorSpec(k, f"{k}:0", "DT_FLOAT" if k == "scores" else "DT_STRING", (-1, -1)) for k in outputs},
    )


def regress_sig() -> SignatureDef:
    return SignatureDef(
        "regress_x_to_y",
        REGRESS_METHOD,
        {"inputs": TensorSpec("inputs", "tf_example:0", "DT_STRING", None)},
        {"outputs": TensorSpec("outputs", "y:0", "DT_FLOAT", (-1, 1))},
    )


def test_classes_and_scores() -> None:
    outputs = {
        "classes": np.array([[b"car", b"bike"], [b"bus", b"\xff"]], dtype=object),
        "scores": np.array([[0.2, 0.7], [0.1, 0.9]], np.float32),
    }
    results = classification_results(outputs, classify_sig("classes", "scores"), 2)
    assert results == [
        [("car", float(np.float32(0.2))), ("bike", float(np.float32(0.7)))],
        [("bus", float(np.float32(0.1))), ("\ufffd", float(np.float32(0.9)))],
    ]
    assert json_codec.encode_classify_response(results) == (
        b'{\n    "results": [[["car", 0.2], ["bike", 0.7]], [["bus", 0.1], ["\xef\xbf\xbd", 0.9]]\n    ]\n}'
    )


def test_scores_only_and_classes_only() -> None:
    scores = {"scores": np.array([[12.0]], np.float32)}
    assert classification_results(scores, classify_sig("scores"), 1) == [[("", 12.0)]]
    classes = {"classes": np.array([["a", "b"]])}
    assert classification_results(classes, classify_sig("classes"), 1) == [[("a", 0.0), ("b", 0.0)]]


@pytest.mark.parametrize(
    ("outputs", "batch", "needle"),
    [
        ({"scores": np.zeros(2, np.float32)}, 2, "Tensor shape: [batch_size num_classes] but got [2]"),
        ({"scores": np.zeros((2, 1), np.float64)}, 2, "Expected scores Tensor of DT_FLOAT. Got: DT_DOUBLE"),
        ({"scores": np.zeros((3, 1), np.float32)}, 2, "Expected scores output batch size of 2. Got: 3"),
        ({"classes": np.zeros((2, 1), np.float32)}, 2, "Expected classes Tensor of DT_STRING. Got: DT_FLOAT"),
        (
            {"classes": np.array([["a", "b"]], dtype=object), "scores": np.zeros((1, 3), np.float32)},
            1,
            "should match in dim_size(1). Got 2 vs. 3",
        ),
    ],
)
def test_classification_errors(outputs: dict, batch: int, needle: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        classification_results(outputs, classify_sig(*outputs), batch)
    assert needle in info.value.message


def test_classification_output_missing() -> None:
    with pytest.raises(InvalidArgument, match="Could not find output tensor 'scores'"):
        outputs = {"classes": np.array([["a"]], dtype=object)}
        classification_results(outputs, classify_sig("classes", "scores"), 1)


def test_classification_without_classes_or_scores() -> None:
    with pytest.raises(InvalidArgument, match="at least one of"):
        classification_results({"y": np.zeros((1, 1))}, classify_sig("y"), 1)


@pytest.mark.parametrize("shape", [(3,), (3, 1)])
def test_regression_shapes(shape: tuple[int, ...]) -> None:
    outputs = {"outputs": np.array([42.0, 0.5, -1.0], np.float32).reshape(shape)}
    assert regression_results(outputs, regress_sig(), 3) == [42.0, 0.5, -1.0]


@pytest.mark.parametrize(
    ("arr", "needle"),
    [
        (np.zeros((2, 2), np.float32), "either [batch_size] or [batch_size, 1] but got [2,2]"),
        (np.zeros((3,), np.float32), "Input batch size did not match output batch size: 2 vs. 3"),
        (np.zeros((2,), np.float64), "Expected output Tensor of DT_FLOAT.  Got: DT_DOUBLE"),
    ],
)
def test_regression_errors(arr: np.ndarray, needle: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        regression_results({"outputs": arr}, regress_sig(), 2)
    assert needle in info.value.message


def test_signature_checks() -> None:
    check_classify_signature(classify_sig("scores"))
    check_regress_signature(regress_sig())
    # the method_name only with TF Serving's --enable_signature_method_name_check
    with pytest.raises(InvalidArgument, match="Expected classification signature method_name"):
        check_classify_signature(regress_sig(), check_method_name=True)
    with pytest.raises(InvalidArgument, match="Expected regression signature method_name"):
        check_regress_signature(classify_sig("scores"), check_method_name=True)
    with pytest.raises(InvalidArgument, match="at least one of"):  # without it, the outputs decide
        check_classify_signature(regress_sig())
    with pytest.raises(InvalidArgument, match="at least one of"):
        check_classify_signature(classify_sig("probabilities"))
    predict = SignatureDef("p", PREDICT_METHOD, {"x": TensorSpec("x", "x:0", "DT_FLOAT", None)}, {})
    with pytest.raises(InvalidArgument, match="Was: tensorflow/serving/predict"):
        check_regress_signature(predict, check_method_name=True)
    with pytest.raises(InvalidArgument, match="Expected one output Tensor"):
        check_regress_signature(predict)


def test_result_protos() -> None:
    proto = classification_result_proto([[("a", 0.5), ("b", 0.25)], [("", 12.0)]])
    assert [[(c.label, c.score) for c in cl.classes] for cl in proto.classifications] == [
        [("a", 0.5), ("b", 0.25)],
        [("", 12.0)],
    ]
    assert [r.value for r in regression_result_proto([42.0, 2.5]).regressions] == [42.0, 2.5]


# -- against TF Serving's own half_plus_two model ----------------------------------------------


@pytest.fixture(scope="module")
def half_plus_two(testdata: Path):
    tf = pytest.importorskip("tensorflow")
    path = testdata / "tf-serving" / "saved_model_half_plus_two_cpu" / "00000123"
    return tf, tf.saved_model.load(str(path))


def _run(half_plus_two, signature: str, examples: list[bytes]) -> dict[str, np.ndarray]:
    tf, model = half_plus_two
    return {k: v.numpy() for k, v in model.signatures[signature](inputs=tf.constant(examples)).items()}


def test_half_plus_two_classify(half_plus_two) -> None:
    doc = json_codec.parse_json(b'{"signature_name": "classify_x_to_y", "examples": [{"x": 20}]}')
    req = json_codec.decode_classify_regress_request(doc)
    examples = build_examples(req.examples, req.context, {"x": "float", "x2": "float"})
    outputs = _run(half_plus_two, req.signature_name, examples)
    results = classification_results(outputs, classify_sig("scores"), 1)
    assert results == [[("", 12.0)]]
    assert json_codec.encode_classify_response(results) == b'{\n    "results": [[["", 12.0]]\n    ]\n}'


def test_half_plus_two_regress_with_context(half_plus_two) -> None:
    examples = build_examples([{"x": 80.0}, {"x2": 4.0}], {"x": 1.0})
    results = regression_results(_run(half_plus_two, "regress_x_to_y", examples), regress_sig(), 2)
    assert results == [42.0, 2.5]
    assert json_codec.encode_regress_response(results) == b'{\n    "results": [42.0, 2.5]\n}'


def test_half_plus_two_refuses_int64_x_without_feature_types(half_plus_two) -> None:
    tf, _ = half_plus_two
    with pytest.raises(tf.errors.InvalidArgumentError, match="Data types don't match"):
        _run(half_plus_two, "regress_x_to_y", build_examples([{"x": 80}], None))
