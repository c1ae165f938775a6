"""Numeric tensors read straight from JSON and CSV bodies must equal what the general path reads.

The fast path (tfserving/json_arrays.py, content_types.numeric_csv) may only ever decline a
body; whatever it accepts must decode to the same arrays, dtypes and errors as the general
path through Python objects.
"""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfservo.codecs import tfs_json as json_codec
from tfservo.codecs.content_types import csv_instances, numeric_csv
from tfservo.codecs.json_arrays import NumericTensor, csv_numbers, parse_numeric_request
from tfservo.core.errors import ServingError
from tfservo.models.signatures import SignatureDef, TensorSpec

DTYPES = ["DT_FLOAT", "DT_DOUBLE", "DT_HALF", "DT_INT32", "DT_INT64", "DT_UINT8", "DT_INT8", "DT_BOOL", "DT_STRING"]


def signature(dtype: str, names: tuple[str, ...] = ("x",)) -> SignatureDef:
    return SignatureDef(
        "serving_default",
        "tensorflow/serving/predict",
        {n: TensorSpec(n, f"{n}:0", dtype, None) for n in names},
        {"y": TensorSpec("y", "y:0", dtype, None)},
    )


def decoded(doc, sig: SignatureDef):
    """(arrays, None) or (None, error message) of the predict decoding of a parsed body."""
    try:
        req = json_codec.decode_predict_request(doc, lambda name: sig)
    except ServingError as exc:
        return None, exc.message
    return {k: (v.dtype.str, v.shape, v.tolist()) for k, v in req.inputs.items()}, None


def assert_same_decoding(body: bytes, sig: SignatureDef) -> None:
    general = None
    # As it is, and through the bounded path of large bodies in chunks of 1 to 7 bytes or 1 MiB.
    for chunked in ({}, {"bounded_from": 0, "chunk_bytes": 1}, {"bounded_from": 0, "chunk_bytes": 7},
                    {"bounded_from": 0}):
        fast = parse_numeric_request(body, **chunked)
        if fast is None:
            continue  # declined: the general path reads it, nothing to compare
        general = general or json_codec.parse_json(body)
        assert decoded(fast, sig) == decoded(general, sig), (chunked, body[:200])


CASES = [
    b'{"instances": [[1.0, 2.0], [3.0, 4.0]]}',
    b'{"instances": [[1, 2], [3, 4]]}',
    b'{"instances": [[1, 2.5], [3, 4]]}',
    b'{"instances": [1, 2, 3]}',
    b'{"instances": [[1, 2], [3]]}',  # ragged
    b'{"instances": [[1], [2, 3], []]}',  # ragged, same totals as a dense [3,1]
    b'{"instances": [[1, 2], 3]}',  # mixed nesting
    b'{"instances": [1, [2]]}',  # an array hidden in a rank-1 array: as many numbers as its shape
    b'{"instances": [[1, [2]], [3, 4]]}',  # rows of the right length, one nesting deeper inside
    b'{"instances": [[1, 2], [3, 4], [5]]}',  # a short last row
    b'{"instances": [[[1, 2], [3, 4]], [[5, 6, 7], [8]]]}',  # rank 3, counts of a dense [2,2,2]
    b'{"inputs": {"x": [[1.0, 2.0]], "z": [[[1]]]}}',  # rank 2 beside rank 3
    b'{"inputs": {"x": [[1.0, 2.0]], "z": [1, [2]]}}',
    b'{"instances": [[[1, 2]], [[3, 4]]]}',
    b'{"instances": [16777216, 1]}',  # not exact in float32
    b'{"instances": [16777215.0, 1]}',
    b'{"instances": [16777215.0, -16777215.0, 0.5]}',  # each within float32's exact range, their squares' sum not
    b'{"instances": [[16777215.5, 1.0]]}',  # just over it, as a float
    b'{"instances": [1e39]}',  # over float32's range
    b'{"instances": [300, 2]}',  # over uint8 / int8
    b'{"instances": [-1, 2]}',
    b'{"instances": [9223372036854775807, 1]}',
    b'{"instances": [18446744073709551615]}',
    b'{"instances": [true, false]}',
    b'{"instances": ["a", "b"]}',
    b'{"instances": [1, "b"]}',
    b'{"instances": [[]]}',
    b'{"instances": []}',
    b'{"inputs": [[1.0, 2.0]]}',
    b'{"inputs": {"x": [[1.0, 2.0]]}}',
    b'{"inputs": {"x": [[1.0, 2.0]], "z": [1]}}',
    b'{"inputs": {"x": [1], "x": [2]}}',  # duplicate key
    b'{"instances": [1], "inputs": [2]}',
    b'{"signature_name": "serving_default", "instances": [[0.5, 1.5]]}',
    b'{"signature_name": "a[b", "instances": [[0.5, 1.5]]}',
    b'{"signature_name": 7, "instances": [[0.5, 1.5]]}',
    b'{"instances": [1.0], "extra": [1, 2]}',
    b'{"ins\\u0074ances": [1.0]}',
    b'{"instances": [NaN, 1.0]}',
    b'{"instances": [-0.0, 0.0, 1e-45]}',
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("body", CASES)
def test_fast_path_decodes_as_the_general_path(body: bytes, dtype: str) -> None:
    padded = body[:-1] + b" " * 1100 + body[-1:]  # over parse_numeric's size threshold too
    for candidate in (body, padded):
        assert_same_decoding(candidate, signature(dtype))
        assert_same_decoding(candidate, signature(dtype, ("x", "z")))


def test_fast_path_takes_the_common_shapes() -> None:
    doc = parse_numeric_request(b'{"instances": [[[1, 2, 3], [4, 5, 6]]], "signature_name": "s"}')
    assert doc is not None and doc["signature_name"] == "s"
    tensor = doc["instances"]
    assert isinstance(tensor, NumericTensor) and tensor.values.dtype == np.int64 and tensor.values.shape == (1, 2, 3)
    doc = parse_numeric_request(b'{"inputs": {"a": [0.5], "b": [[1, 2]]}}')
    assert doc is not None and doc["inputs"]["a"].values.dtype == np.float64
    assert doc["inputs"]["b"].values.shape == (1, 2)
    for declined in (b'{"instances": [[1, 2], [3]]}', b'{"instances": [[1], [2, 3], []]}', b'{"examples": [{"x": 1}]}',
                     b'{"instances": [1, [2]]}', b'{"instances": [[1, [2]], [3, 4]]}',
                     b'{"instances": [[[1, 2], [3, 4]], [[5, 6, 7], [8]]]}', b'{"inputs": {"x": [[1.0]], "z": [1, [2]]}}'):
        padded = declined[:-1] + b" " * 1100 + declined[-1:]  # long enough for the row-by-row check
        for body in (declined, padded):
            assert parse_numeric_request(body) is None, body[:60]
            assert parse_numeric_request(body, bounded_from=0, chunk_bytes=3) is None


def test_large_single_arrays_take_the_bounded_path() -> None:
    body = b'{"signature_name": "s", "instances": [[1, 2, 3], [4, 5, 6.5]]}'
    doc = parse_numeric_request(body, bounded_from=0, chunk_bytes=2)
    assert doc is not None and doc["signature_name"] == "s"
    assert doc["instances"].values.dtype == np.float64 and doc["instances"].values.tolist() == [[1, 2, 3], [4, 5, 6.5]]
    for declined in (
        b'{"instances": [1, 2], "instances": [3, 4]}',  # duplicate key
        b'{"instances": [1, 2], "other": 1}',
        b'{"instances": [[1, 2]], "signature_name": "x]"}',
        b'{"instances": [1, null]}',
        b'[[1, 2]]',
    ):
        assert parse_numeric_request(declined, bounded_from=0, chunk_bytes=2) is None, declined
    # Several arrays: the document path reads those, whatever the size.
    doc = parse_numeric_request(b'{"inputs": {"a": [1], "b": [[2, 3]]}}', bounded_from=0, chunk_bytes=2)
    assert doc is not None and doc["inputs"]["b"].values.shape == (1, 2)


nested = st.recursive(
    st.one_of(st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False, width=32)),
    lambda children: st.lists(children, min_size=0, max_size=4),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=nested, dtype=st.sampled_from(["DT_FLOAT", "DT_INT32", "DT_DOUBLE", "DT_INT64"]), key=st.sampled_from(["instances", "inputs"]))
def test_generated_bodies_decode_alike(value, dtype: str, key: str) -> None:
    body = orjson.dumps({key: value})
    assert_same_decoding(body, signature(dtype))


rows = st.lists(
    st.lists(st.one_of(st.integers(-1000, 10**9), st.floats(-1e6, 1e6, allow_nan=False).map(lambda f: round(f, 3))), min_size=1, max_size=4),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(table=rows, dtype=st.sampled_from(["DT_FLOAT", "DT_INT32", "DT_INT64"]), ragged=st.booleans())
def test_generated_csv_decodes_alike(table, dtype: str, ragged: bool) -> None:
    if not ragged:
        width = len(table[0])
        table = [(row * width)[:width] for row in table]
    text = "\n".join(",".join(json.dumps(v) for v in row) for row in table) + "\n"
    fast = numeric_csv(text.encode(), text)
    # Read a few lines at a time, the same numbers or the same refusal.
    chunked = csv_numbers(text.encode().rstrip(b"\n"), len(table), len(table[0]), chunk_bytes=5)
    assert (chunked is None) == (fast is None)
    if fast is None:
        return
    assert chunked.dtype == fast.values.dtype and chunked.tolist() == fast.values.ravel().tolist()
    assert not ragged or len({len(r) for r in table}) == 1
    sig = signature(dtype)
    assert decoded({"instances": fast}, sig) == decoded({"instances": csv_instances(text)}, sig), text[:200]


@pytest.mark.parametrize(
    "text",
    ["1,2\n3,4\n", "1.5\n2.5\n", "1\n\n2\n", "1,2\n3\n", "+1\n2\n", ".5\n", "007\n", '"1",2\n', "1,,2\n", "a,b\n",
     "1\r\n2\r\n", " 1 , 2 \n3,4\n", "1,2\n3,4,5\n1\n"],
)
def test_csv_fast_path_matches_csv_instances(text: str) -> None:
    fast = numeric_csv(text.encode(), text)
    if fast is not None:
        assert fast.values.tolist() == csv_instances(text)


@pytest.mark.parametrize("values", [[[0.5, 1.5]], [[16777215.0, -16777215.0, 0.5]], [[1e-45, -2.5]], [[0.5] * 9000]])
def test_numbers_within_float32s_exact_range_convert_without_the_general_path(values: list) -> None:
    def general() -> object:
        raise AssertionError("the numbers were sent down the general path")

    arrays, error = decoded({"instances": NumericTensor(np.array(values, dtype=np.float64), general)}, signature("DT_FLOAT"))
    assert error is None and arrays is not None
    assert arrays["x"] == ("<f4", (1, len(values[0])), np.array(values, dtype=np.float32).tolist())
