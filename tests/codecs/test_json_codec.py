"""TF Serving REST JSON codec: request decoding, response layout, errors, speed."""

from __future__ import annotations

import base64
import json
import math
import time

import numpy as np
import orjson
import pytest

from tfservo.codecs import tfs_json as jc
from tfservo.core.errors import Code, InvalidArgument, Unimplemented
from tfservo.core.status import http_status
from tfservo.models.signatures import SignatureDef, TensorSpec


def sig(name: str = "serving_default", **inputs: str) -> SignatureDef:
    return SignatureDef(
        name,
        "tensorflow/serving/predict",
        {k: TensorSpec(k, f"{k}:0", dt, None) for k, dt in inputs.items()},
        {},
    )


def decode(body: bytes | str, signature: SignatureDef) -> jc.PredictRequest:
    seen: list[str] = []

    def signature_of(name: str) -> SignatureDef:
        seen.append(name)
        return signature

    req = jc.decode_predict_request(jc.parse_json(body), signature_of)
    assert seen == [req.signature_name]
    return req


def error_of(body: bytes | str, signature: SignatureDef) -> str:
    with pytest.raises(InvalidArgument) as info:
        decode(body, signature)
    return info.value.message


X = sig(x="DT_FLOAT")


# -- parse_json --------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"", b"   \n"])
def test_empty_body(body: bytes) -> None:
    with pytest.raises(InvalidArgument, match="document is empty"):
        jc.parse_json(body)


def test_malformed_body_names_offset() -> None:
    with pytest.raises(InvalidArgument, match=r"JSON Parse error: .* at offset: \d+"):
        jc.parse_json(b'{"instances": [1, 2')


def test_invalid_utf8_names_byte_and_offset() -> None:
    with pytest.raises(InvalidArgument, match=r"not valid UTF-8 \(byte 0xff at offset 16\).*b64"):
        jc.parse_json(b'{"instances": ["\xff"]}')


@pytest.mark.parametrize("depth", [jc.MAX_DEPTH + 1, 1000, 5000])
def test_too_deep_is_invalid_argument(depth: int) -> None:
    with pytest.raises(InvalidArgument, match="nested more than"):
        jc.parse_json(b"[" * depth + b"]" * depth)


def test_deep_but_allowed() -> None:
    doc = jc.parse_json(b"[" * jc.MAX_DEPTH + b"]" * jc.MAX_DEPTH)
    assert isinstance(doc, list)


def test_brackets_inside_strings_are_not_nesting() -> None:
    body = orjson.dumps({"instances": ["[" * 5000, "{" * 5000]})
    assert jc.parse_json(body)["instances"][0] == "[" * 5000


def test_nan_and_infinity_accepted_like_rapidjson() -> None:
    doc = jc.parse_json(b'{"instances": [NaN, Infinity, -Infinity, 1.5]}')
    values = doc["instances"]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf, 1.5]


def test_bom_is_skipped() -> None:
    assert jc.parse_json(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}


def test_str_body() -> None:
    assert jc.parse_json('{"a": "é"}') == {"a": "é"}


# -- decode_predict_request: shapes, formats, signatures ---------------------------------------


def test_row_format_single_input() -> None:
    req = decode(b'{"instances": [1.0, 2.0, 5.0]}', X)
    assert req.row_format and req.signature_name == "serving_default"
    assert req.inputs["x"].dtype == np.float32
    np.testing.assert_array_equal(req.inputs["x"], [1.0, 2.0, 5.0])


def test_row_format_int32_matrix() -> None:
    req = decode(b'{"instances": [[1,2],[3,4],[5,6]]}', sig(default="DT_INT32"))
    assert req.inputs["default"].dtype == np.int32
    np.testing.assert_array_equal(req.inputs["default"], [[1, 2], [3, 4], [5, 6]])


def test_mixed_ints_and_decimals_for_float() -> None:
    req = decode(b'{"instances": [1, 2.0, 3, 4, 5.003, 0.007, 0.0]}', X)
    np.testing.assert_array_equal(req.inputs["x"], np.array([1, 2, 3, 4, 5.003, 0.007, 0], np.float32))


def test_signature_name_is_passed_and_defaults() -> None:
    assert decode(b'{"signature_name": "predict_images", "instances": [[1]]}', X).signature_name == (
        "predict_images"
    )
    assert decode(b'{"signature_name": "", "instances": [[1]]}', X).signature_name == "serving_default"


def test_signature_name_must_be_string() -> None:
    assert "must be a string value" in error_of(b'{"signature_name": 5, "instances": [1]}', X)


def test_signature_without_inputs() -> None:
    assert "Failed to get input map for signature: serving_default" in error_of(b'{"instances": [1]}', sig())


def test_named_instances_are_batched() -> None:
    s = sig(int_tensor="DT_INT32", str_tensor="DT_STRING", float_tensor="DT_FLOAT", dbl_tensor="DT_DOUBLE")
    req = decode(
        b"""{"instances": [
          {"int_tensor": [[1,2],[3,4],[5,6]], "str_tensor": ["foo", "bar"],
           "float_tensor": [1.0, NaN], "dbl_tensor": [NaN]},
          {"int_tensor": [[7,8],[9,0],[1,2]], "str_tensor": ["baz", "bat"],
           "float_tensor": [2.0, Infinity], "dbl_tensor": [2.0]}]}""",
        s,
    )
    assert req.inputs["int_tensor"].shape == (2, 3, 2)
    assert req.inputs["str_tensor"].dtype == object
    assert req.inputs["str_tensor"].tolist() == [[b"foo", b"bar"], [b"baz", b"bat"]]
    f = req.inputs["float_tensor"]
    assert f.dtype == np.float32 and f[0, 0] == 1.0 and math.isnan(f[0, 1]) and f[1, 1] == math.inf
    assert req.inputs["dbl_tensor"].dtype == np.float64 and req.inputs["dbl_tensor"].shape == (2, 1)


def test_columnar_named_and_unnamed() -> None:
    s = sig(int_tensor="DT_INT32")
    a = decode(b'{"inputs": {"int_tensor": [[[1,2],[3,4],[5,6]]]}}', s)
    b = decode(b'{"inputs": [[[1,2],[3,4],[5,6]]]}', s)
    assert not a.row_format and a.inputs["int_tensor"].shape == (1, 3, 2)
    np.testing.assert_array_equal(a.inputs["int_tensor"], b.inputs["int_tensor"])


def test_columnar_multiple_inputs_with_b64_scalar() -> None:
    s = sig(int_tensor="DT_INT32", str_tensor="DT_STRING", bin_tensor="DT_STRING")
    req = decode(
        b'{"inputs": {"int_tensor": [[[1,2],[3,4],[5,6]]], "str_tensor": ["foo", "bar"],'
        b' "bin_tensor": {"b64": "aGVsbG8="}}}',
        s,
    )
    assert req.inputs["str_tensor"].tolist() == [b"foo", b"bar"]
    assert req.inputs["bin_tensor"].shape == () and req.inputs["bin_tensor"][()] == b"hello"


def test_columnar_scalar() -> None:
    req = decode(b'{"inputs": 3.5}', X)
    assert req.inputs["x"].shape == () and req.inputs["x"].dtype == np.float32 and req.inputs["x"] == 3.5


def test_columnar_ignores_keys_that_are_not_inputs_like_tf_serving() -> None:
    req = decode(b'{"inputs": {"x": [1.0], "extra": "ignored"}}', X)
    assert list(req.inputs) == ["x"]


def test_columnar_missing_named_input() -> None:
    msg = error_of(b'{"inputs": {"a": [1.0]}}', sig(a="DT_FLOAT", b="DT_FLOAT"))
    assert "Missing named input: b in 'inputs' object" in msg


def test_columnar_plain_value_for_several_inputs() -> None:
    msg = error_of(b'{"inputs": [1.0]}', sig(a="DT_FLOAT", b="DT_FLOAT"))
    assert "inputs is a plain value/list" in msg and "a, b" in msg


def test_row_plain_list_for_several_inputs() -> None:
    msg = error_of(b'{"instances": [1.0]}', sig(a="DT_FLOAT", b="DT_FLOAT"))
    assert "instances is a plain list" in msg and "a, b" in msg


def test_row_unknown_input_is_named() -> None:
    msg = error_of(b'{"instances": [{"x": 1.0, "y": 2.0}]}', X)
    assert "element: 0 key: y" in msg and "does not have named input: y" in msg and "are: x" in msg


def test_row_missing_input_is_named() -> None:
    msg = error_of(b'{"instances": [{"a": 1.0, "b": 1.0}, {"a": 2.0}]}', sig(a="DT_FLOAT", b="DT_FLOAT"))
    assert "element: 1 of 'instances' list" in msg and "missing: b" in msg


def test_row_object_then_list() -> None:
    s = sig(int_tensor="DT_INT32", str_tensor="DT_STRING")
    msg = error_of(
        b'{"instances": [{"int_tensor": [1], "str_tensor": ["a"]}, [1, 20, 30]]}',
        s,
    )
    assert "Expecting object but got" in msg and "item 1" in msg


def test_row_list_then_object() -> None:
    body = b'{"instances": [["baz", "bar"], {"str_tensor": ["baz", "bat"]}]}'
    msg = error_of(body, sig(str_tensor="DT_STRING"))
    assert "Expecting value/list but got object at item 1" in msg


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"instances": [1], "inputs": [1]}', "only one of 'inputs' or 'instances'"),
        (b'{"signature_name": "a"}', "Missing 'inputs' or 'instances' key"),
        (b'{"instances": {"x": 1}}', "'instances' to be an list/array"),
        (b'{"instances": []}', "No values in 'instances' array"),
        (b"[1, 2]", "Is not object"),
    ],
)
def test_request_shape_errors(body: bytes, needle: str) -> None:
    assert needle in error_of(body, X)


# -- decode: ragged and mistyped values --------------------------------------------------------


@pytest.mark.parametrize(
    ("instances", "needle"),
    [
        (
            "[[1,2],[3,4],[5,6,7]]",
            "Failed to process element: 2 of 'instances' list. Error: Invalid argument: "
            "Expecting tensor size: 2 but got: 3",
        ),
        ("[[1,2],[3,4],[[5,6]]]", "Expecting shape [2] but got: [1,2]"),
        ("[1, [1]]", "Expecting shape [] but got: [1]"),
        ("[[1,2],[\"a\", \"b\"]]", 'JSON Value: "a" Type: String is not of expected type: int32'),
        ("[[[1,2],[3]]]", "Encountered list at unexpected size: 1 at level: 1 expected size: 2"),
        ("[[[1,2],3]]", "JSON Value: 3 found at incorrect level: 2"),
        ("[[1,[2]]]", "Encountered list at unexpected level: 1 expected < 1"),
    ],
)
def test_ragged_and_mistyped_rows(instances: str, needle: str) -> None:
    msg = error_of(f'{{"instances": {instances}}}', sig(default="DT_INT32"))
    assert needle in msg


def test_ragged_columnar_names_input() -> None:
    msg = error_of(b'{"inputs": {"x": [[1.0, 2.0], [3.0]]}}', X)
    assert msg.startswith("Failed to process input: x of 'inputs'")
    assert "unexpected size: 1 at level: 1 expected size: 2" in msg and "ragged" in msg


@pytest.mark.parametrize(
    ("dtype", "value", "needle"),
    [
        ("DT_FLOAT", '"1.0"', 'JSON Value: "1.0" Type: String is not of expected type: float'),
        ("DT_FLOAT", "true", "Type: True is not of expected type: float"),
        ("DT_FLOAT", "null", "Type: Null is not of expected type: float"),
        ("DT_FLOAT", '{"a": 1}', "Type: Object is not of expected type: float"),
        ("DT_FLOAT", "16777217", "Cannot convert JSON value: 16777217 to float without loss of precision"),
        ("DT_FLOAT", "1e39", "to float without loss of precision"),
        ("DT_DOUBLE", "9007199254740993", "to double without loss of precision"),
        ("DT_HALF", "70000.0", "to half without loss of precision"),
        ("DT_INT32", "1.5", "Type: Number is not of expected type: int32"),
        ("DT_INT32", "3000000000", "is not of expected type: int32 (it must be an integer from"),
        ("DT_UINT8", "256", "not of expected type: uint8 (it must be an integer from 0 to 255)"),
        ("DT_UINT8", "-1", "not of expected type: uint8"),
        ("DT_INT64", "9223372036854775808", "not of expected type: int64"),
        ("DT_UINT64", "-1", "not of expected type: uint64"),
        ("DT_BOOL", "1", "Type: Number is not of expected type: bool"),
        ("DT_STRING", "1", "Type: Number is not of expected type: string"),
        ("DT_STRING", '{"b64": "aGVsbG8=", "x": 1}', "not formatted correctly for base64 data"),
        ("DT_STRING", '{"b64": "a$b="}', "Unable to base64 decode"),
        ("DT_STRING", '{"b64": "é"}', "Unable to base64 decode"),
    ],
)
def test_wrong_values_name_the_element(dtype: str, value: str, needle: str) -> None:
    first = {"DT_STRING": '"a"', "DT_BOOL": "false"}.get(dtype, "0")
    msg = error_of(f'{{"instances": [[{first}], [{value}]]}}', sig(v=dtype))
    assert "Failed to process element: 1 of 'instances' list" in msg
    assert needle in msg


def test_mixed_numbers_and_bools_are_refused() -> None:
    assert "Type: True is not of expected type: float" in error_of(b'{"instances": [1.5, true]}', X)


def test_unsupported_dtype_is_unimplemented() -> None:
    with pytest.raises(Unimplemented, match="DT_COMPLEX64"):
        decode(b'{"inputs": [1.0]}', sig(c="DT_COMPLEX64"))


def test_rank_over_64_is_refused() -> None:
    body = b'{"inputs": ' + b"[" * 300 + b"1" + b"]" * 300 + b"}"
    assert "nested more than 64 lists deep; tensors have at most 64 dimensions" in error_of(body, X)


@pytest.mark.parametrize(
    ("dtype", "np_type", "values"),
    [
        ("DT_FLOAT", np.float32, [1.5, -2]),
        ("DT_DOUBLE", np.float64, [0.1, 2]),
        ("DT_HALF", np.float16, [0.5, 2047]),
        ("DT_INT8", np.int8, [-128, 127]),
        ("DT_INT16", np.int16, [-32768, 32767]),
        ("DT_INT32", np.int32, [-(2**31), 2**31 - 1]),
        ("DT_INT64", np.int64, [-(2**63), 2**63 - 1]),
        ("DT_UINT8", np.uint8, [0, 255]),
        ("DT_UINT16", np.uint16, [0, 65535]),
        ("DT_UINT32", np.uint32, [0, 2**32 - 1]),
        ("DT_UINT64", np.uint64, [0, 2**64 - 1]),
        ("DT_BOOL", np.bool_, [True, False]),
    ],
)
def test_every_dtype(dtype: str, np_type: type, values: list) -> None:
    for body in (orjson.dumps({"instances": [values, values]}), orjson.dumps({"inputs": values})):
        arr = decode(body, sig(v=dtype)).inputs["v"]
        assert arr.dtype == np_type
        np.testing.assert_array_equal(arr.reshape(-1, 2)[0], np.array(values, dtype=np_type))


def test_strings_are_utf8_bytes_and_b64_is_decoded() -> None:
    req = decode('{"instances": ["héllo", {"b64": "d29y\\nbGQ"}, {"b64": ""}]}', sig(s="DT_STRING"))
    assert req.inputs["s"].tolist() == ["héllo".encode(), b"world", b""]


def test_b64_lists_and_named() -> None:
    s = sig(default="DT_STRING")
    req = decode(b'{"instances": [[{"b64": "aGVsbG8="}], [{"b64": "d29ybGQ="}]]}', s)
    assert req.inputs["default"].shape == (2, 1)
    req = decode(b'{"instances": [{"default": [[{"b64": "aGVsbG8="}], [{"b64": "d29ybGQ="}]]}]}', s)
    assert req.inputs["default"].shape == (1, 2, 1)
    assert req.inputs["default"].reshape(-1).tolist() == [b"hello", b"world"]


def test_empty_inner_lists() -> None:
    req = decode(b'{"instances": [[], []]}', X)
    assert req.inputs["x"].shape == (2, 0) and req.inputs["x"].dtype == np.float32


def test_fast_path_matches_slow_path() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(size=(4, 3, 5)).tolist()
    fast = decode(orjson.dumps({"inputs": values}), X).inputs["x"]
    slow_values = [*values[:-1], [[*row[:-1], math.nan] for row in values[-1]]]  # NaN: slow path
    slow = decode(json.dumps({"inputs": slow_values}), X).inputs["x"]
    np.testing.assert_array_equal(fast[:-1], slow[:-1])
    np.testing.assert_array_equal(fast[-1][:, :-1], slow[-1][:, :-1])
    assert np.isnan(slow[-1][:, -1]).all() and slow.dtype == np.float32


def test_decode_speed_32x784() -> None:
    x = np.random.default_rng(0).random((32, 784))
    body = orjson.dumps({"instances": x}, option=orjson.OPT_SERIALIZE_NUMPY)
    s = sig(x="DT_FLOAT")
    decode(body, s)
    start = time.perf_counter()
    for _ in range(10):
        arr = decode(body, s).inputs["x"]
    per_call = (time.perf_counter() - start) / 10
    assert arr.shape == (32, 784) and arr.dtype == np.float32
    assert per_call < 0.02, f"parse+decode took {per_call * 1000:.1f} ms"


# -- encode_predict_response -------------------------------------------------------------------


def test_row_response_layout_is_tf_servings() -> None:
    out = jc.encode_predict_response({"y": np.array([2.5, 3.0, 4.5], np.float32)}, True)
    assert out == b'{\n    "predictions": [2.5, 3.0, 4.5\n    ]\n}'


def test_row_response_nested() -> None:
    arr = np.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], np.int32)
    out = jc.encode_predict_response({"t": arr}, True)
    assert out == b'{\n    "predictions": [[[1, 2], [3, 4]], [[5, 6], [7, 8]]\n    ]\n}'


def test_columnar_response_layout() -> None:
    out = jc.encode_predict_response({"y": np.array([[2.5], [3.0]], np.float32)}, False)
    assert out == (
        b'{\n    "outputs": [\n        [\n            2.5\n        ],\n        [\n            3.0\n'
        b"        ]\n    ]\n}"
    )


def test_multi_output_rows_layout() -> None:
    out = jc.encode_predict_response(
        {"b": np.array([1, 2], np.int64), "a": np.array([[0.5], [1.0]], np.float32)}, True
    )
    assert out == (
        b'{\n    "predictions": [\n        {\n            "a": [0.5],\n            "b": 1\n        },'
        b'\n        {\n            "a": [1.0],\n            "b": 2\n        }\n    ]\n}'
    )


def test_multi_output_columns_layout() -> None:
    out = jc.encode_predict_response({"b": np.array([1, 2]), "a": np.array(7.0)}, False)
    assert out == (
        b'{\n    "outputs": {\n        "a": 7.0,\n        "b": [\n            1,\n            2\n'
        b"        ]\n    }\n}"
    )


def test_tf_serving_multiple_named_tensors_semantics() -> None:
    outputs = {
        "int_tensor": np.array([[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 0], [1, 2]]], np.int32),
        "str_tensor": np.array([[b"foo", b"bar"], [b"baz", b"bat"]], dtype=object),
        "float_tensor": np.array([[1.0], [2.0]], np.float32),
        "double_scalar_tensor": np.array([8.0, 9.0]),
        "str_tensor_bytes": np.array([[b"hello", b"world"], [b"tf", b"serving"]], dtype=object),
    }
    rows = orjson.loads(jc.encode_predict_response(outputs, True))
    assert rows == {
        "predictions": [
            {
                "double_scalar_tensor": 8.0,
                "float_tensor": [1.0],
                "int_tensor": [[1, 2], [3, 4], [5, 6]],
                "str_tensor": ["foo", "bar"],
                "str_tensor_bytes": [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}],
            },
            {
                "double_scalar_tensor": 9.0,
                "float_tensor": [2.0],
                "int_tensor": [[7, 8], [9, 0], [1, 2]],
                "str_tensor": ["baz", "bat"],
                "str_tensor_bytes": [{"b64": "dGY="}, {"b64": "c2VydmluZw=="}],
            },
        ]
    }
    cols = orjson.loads(jc.encode_predict_response(outputs, False))
    assert cols["outputs"]["str_tensor_bytes"] == [
        [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}],
        [{"b64": "dGY="}, {"b64": "c2VydmluZw=="}],
    ]
    assert cols["outputs"]["double_scalar_tensor"] == [8.0, 9.0]


def test_bytes_output_in_row_layout() -> None:
    out = jc.encode_predict_response({"o_bytes": np.array([b"a", b"b"], dtype=object)}, True)
    assert out == (
        b'{\n    "predictions": [{\n            "b64": "YQ=="\n        }, {\n            "b64": "Yg=="\n'
        b"        }\n    ]\n}"
    )


def test_strings_are_text_unless_invalid_utf8() -> None:
    out = jc.encode_predict_response({"s": np.array(["é".encode(), b"\xff", "x"], dtype=object)}, False)
    assert orjson.loads(out) == {"outputs": ["é", {"b64": "/w=="}, "x"]}
    assert orjson.loads(jc.encode_predict_response({"s": np.array([b"a", b"bc"])}, True)) == {
        "predictions": ["a", "bc"]
    }


def test_float_formatting() -> None:
    out = jc.encode_predict_response({"y": np.array([0.1, 0.2, 1 / 3, 12.0], np.float32)}, True)
    assert out == b'{\n    "predictions": [0.1, 0.2, 0.33333334, 12.0\n    ]\n}'
    values = orjson.loads(out)["predictions"]
    np.testing.assert_array_equal(np.array(values, np.float32), np.array([0.1, 0.2, 1 / 3, 12.0], np.float32))


def test_non_finite_written_as_tf_serving_does() -> None:
    arr = np.array([[np.nan, np.inf], [3.0, -np.inf]], np.float32)
    assert jc.encode_predict_response({"f": arr}, True) == (
        b'{\n    "predictions": [[NaN, Infinity], [3.0, -Infinity]\n    ]\n}'
    )
    cols = jc.encode_predict_response({"f": arr, "g": np.array([np.nan])}, False)
    assert json.loads(cols) is not None and b"NaN" in cols and b"null" not in cols


def test_other_dtypes() -> None:
    outputs = {
        "b": np.array([True, False]),
        "h": np.array([0.5, 2.0], np.float16),
        "u": np.array([0, 2**64 - 1], np.uint64),
        "nc": np.arange(8, dtype=np.float64).reshape(2, 4)[:, ::2],
        "be": np.array([1, 2], dtype=">i4"),
    }
    assert orjson.loads(jc.encode_predict_response(outputs, False))["outputs"] == {
        "b": [True, False],
        "be": [1, 2],
        "h": [0.5, 2.0],
        "nc": [[0.0, 2.0], [4.0, 6.0]],
        "u": [0, 2**64 - 1],
    }


def test_zero_batch_rows() -> None:
    assert jc.encode_predict_response({"t": np.zeros((0, 2), np.int32)}, True) == (
        b'{\n    "predictions": []\n}'
    )
    two = {"s": np.zeros((0, 1, 2), dtype=object), "f": np.zeros((0, 3, 4), np.float32)}
    assert orjson.loads(jc.encode_predict_response(two, True)) == {"predictions": []}


@pytest.mark.parametrize(
    ("outputs", "row", "needle"),
    [
        ({}, True, "empty tensor map"),
        ({"t": np.array(1)}, True, "has no shape information"),
        ({"a": np.zeros((2, 3)), "b": np.zeros((1, 3))}, True, "inconsistent batch size: 1 expecting: 2"),
        ({"c": np.array([1 + 2j])}, False, "complex128"),
    ],
)
def test_encode_errors(outputs: dict, row: bool, needle: str) -> None:
    with pytest.raises(InvalidArgument, match=needle.replace("(", r"\(")):
        jc.encode_predict_response(outputs, row)


def test_inconsistent_batches_are_fine_in_columnar() -> None:
    out = orjson.loads(jc.encode_predict_response({"a": np.zeros((2, 1)), "b": np.zeros(1)}, False))
    assert out == {"outputs": {"a": [[0.0], [0.0]], "b": [0.0]}}


def _reference(outputs: dict[str, np.ndarray], row: bool) -> bytes:
    """Element-by-element rapidjson layout (TF Serving's algorithm), to check the chunked fast path."""
    w = jc._Writer()
    names = sorted(outputs)

    def token(x: np.generic) -> bytes:
        return orjson.dumps(x, option=orjson.OPT_SERIALIZE_NUMPY)

    def values(arr: np.ndarray) -> None:
        if arr.ndim == 0:
            w.raw(token(arr[()]))
            return
        w.start_array()
        for sub in arr:
            values(np.asarray(sub))
        w.end_array()

    w.start_object()
    w.key("predictions" if row else "outputs")
    if row:
        w.start_array()
        for i in range(outputs[names[0]].shape[0]):
            if len(names) > 1:
                w.start_object()
            w.single_line = True
            for n in names:
                if len(names) > 1:
                    w.key(n)
                values(outputs[n][i])
            w.single_line = False
            if len(names) > 1:
                w.end_object()
        w.end_array()
    else:
        if len(names) > 1:
            w.start_object()
        for n in names:
            if len(names) > 1:
                w.key(n)
            values(outputs[n])
        if len(names) > 1:
            w.end_object()
    w.end_object()
    return w.getvalue()


@pytest.mark.parametrize(
    "shapes", [[(3,)], [(2, 3)], [(2, 2, 2)], [(3,), (3, 2)], [(2, 0), (2, 3, 1)], [(1, 1, 1, 2)]]
)
@pytest.mark.parametrize("row", [True, False])
def test_fast_layout_equals_reference(shapes: list[tuple[int, ...]], row: bool) -> None:
    rng = np.random.default_rng(len(shapes))
    outputs = {f"o{i}": rng.normal(size=s).astype(np.float32) for i, s in enumerate(shapes)}
    assert jc.encode_predict_response(outputs, row) == _reference(outputs, row)


def test_encode_speed_32x1000() -> None:
    y = np.random.default_rng(0).random((32, 1000)).astype(np.float32)
    for row in (True, False):
        jc.encode_predict_response({"y": y}, row)
        start = time.perf_counter()
        for _ in range(10):
            out = jc.encode_predict_response({"y": y}, row)
        per_call = (time.perf_counter() - start) / 10
        assert per_call < 0.02, f"encode took {per_call * 1000:.1f} ms"
        key = "predictions" if row else "outputs"
        np.testing.assert_array_equal(np.array(orjson.loads(out)[key], np.float32), y)


# -- classify / regress ------------------------------------------------------------------------


def test_decode_classify_request() -> None:
    req = jc.decode_classify_regress_request(
        jc.parse_json(b'{"context": {"q": "pizza"}, "examples": [{"x": 1}, {"x": [2.0, 3.0]}]}')
    )
    assert req.signature_name == "serving_default"
    assert req.context == {"q": "pizza"} and req.examples == [{"x": 1}, {"x": [2.0, 3.0]}]
    req = jc.decode_classify_regress_request({"signature_name": "s", "examples": [{}]}, "regress")
    assert req.signature_name == "s" and req.context is None


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"signature_name": ["hello"], "examples": [{}]}, "'signature_name' key must be a string"),
        ({"context": [{"names": ["foo"]}]}, "Example must be JSON object but got JSON Array in 'context'"),
        ({"context": None, "examples": [{}]}, "Example must be JSON object but got JSON Null"),
        ({"examples": {"names": ["foo", "bar"]}}, "list/array"),
        ({"examples": []}, "'examples' value is an empty array"),
        ({"examples": [[{"names": ["foo"]}]]}, "Example must be JSON object but got JSON Array at element 0"),
        ({"signature_name": "s"}, "When method is regress, key 'examples' is expected"),
        ([1], "Is not object"),
    ],
)
def test_classify_request_errors(doc: object, needle: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        jc.decode_classify_regress_request(doc, "regress")
    assert needle in info.value.message


def test_classify_response_layout() -> None:
    out = jc.encode_classify_response([[("car", 0.2), ("bike", 0.7)], [("", 12.0)]])
    assert out == b'{\n    "results": [[["car", 0.2], ["bike", 0.7]], [["", 12.0]]\n    ]\n}'


def test_regress_response_layout() -> None:
    assert jc.encode_regress_response([42.0, 0.2]) == b'{\n    "results": [42.0, 0.2]\n}'
    out = jc.encode_regress_response([0.2, math.inf, -math.inf, math.nan])
    assert out == b'{\n    "results": [0.2, Infinity, -Infinity, NaN]\n}'


def test_empty_results_are_errors() -> None:
    with pytest.raises(InvalidArgument, match="empty ClassificationResults"):
        jc.encode_classify_response([])
    with pytest.raises(InvalidArgument, match="empty RegressionResults"):
        jc.encode_regress_response([])


# -- errors ------------------------------------------------------------------------------------


def test_error_body_is_valid_json() -> None:
    message = 'Bad key: "key" \'k\'\n é \x01'
    body = jc.error_body(message)
    assert body.startswith(b'{ "error": ') and json.loads(body) == {"error": message}


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (Code.OK, 200),
        (Code.CANCELLED, 499),
        (Code.UNKNOWN, 500),
        (Code.INVALID_ARGUMENT, 400),
        (Code.DEADLINE_EXCEEDED, 504),
        (Code.NOT_FOUND, 404),
        (Code.ALREADY_EXISTS, 409),
        (Code.PERMISSION_DENIED, 403),
        (Code.RESOURCE_EXHAUSTED, 429),
        (Code.FAILED_PRECONDITION, 400),
        (Code.ABORTED, 409),
        (Code.OUT_OF_RANGE, 400),
        (Code.UNIMPLEMENTED, 501),
        (Code.INTERNAL, 500),
        (Code.UNAVAILABLE, 503),
        (Code.DATA_LOSS, 500),
        (Code.UNAUTHENTICATED, 401),
        (99, 500),
    ],
)
def test_http_status(code: int, status: int) -> None:
    assert http_status(code) == status


def test_b64_roundtrip_through_encoder_and_decoder() -> None:
    data = bytes(range(256))
    out = jc.encode_predict_response({"img_bytes": np.array([data], dtype=object)}, True)
    b64 = orjson.loads(out)["predictions"][0]
    assert base64.b64decode(b64["b64"]) == data
    req = decode(orjson.dumps({"instances": [b64]}), sig(img="DT_STRING"))
    assert req.inputs["img"].tolist() == [data]
