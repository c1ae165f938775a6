"""TensorProto ⇄ numpy against TensorFlow's own encoder and decoder."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, types_pb2

from tfservo.codecs.tensor_proto import MAX_FILL_BYTES, to_ndarray, to_tensor_proto
from tfservo.core.errors import InvalidArgument

rng = np.random.default_rng(7)
ARRAYS = {
    "float32 large": rng.random((3, 100), dtype=np.float32),
    "float32 small": np.array([[1.5], [-2.0]], np.float32),
    "float64": rng.random(70),
    "int32": np.arange(-50, 50, dtype=np.int32).reshape(10, 10),
    "int64": np.array([-(2**40), 0, 2**62], np.int64),
    "uint8": np.array([0, 255], np.uint8),
    "int8": np.array([-128, 127], np.int8),
    "int16": np.array([-300, 300], np.int16),
    "uint16": np.array([0, 65535], np.uint16),
    "uint32": np.array([2**32 - 1], np.uint32),
    "uint64": np.array([2**64 - 1], np.uint64),
    "bool": np.array([True, False, True]),
    "float16": np.array([1.5, -2.25], np.float16),
    "bfloat16": np.array([1.5, -2.25], ml_dtypes.bfloat16),
    "complex64": (rng.random(80) + 1j * rng.random(80)).astype(np.complex64),
    "complex128": np.array([1 + 2j, -3j]),
    "string": np.array([[b"a", b""], ["\u00e9".encode(), b"\x00\xff"]], dtype=object),
    "scalar": np.array(3.0, np.float32),
    "empty": np.zeros((0, 3), np.float32),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_round_trip_and_tensorflow_agree(name):
    arr = ARRAYS[name]
    proto = to_tensor_proto(arr)
    assert not proto.tensor_content  # TF Serving answers in the typed fields
    for decoded in (to_ndarray(proto), to_ndarray(tf.make_tensor_proto(arr))):
        assert decoded.dtype == arr.dtype and decoded.shape == arr.shape
        assert np.array_equal(decoded, arr)
    from_tf = tf.make_ndarray(proto)
    assert np.array_equal(from_tf.astype(arr.dtype) if arr.dtype != object else from_tf, arr)


def test_large_float_fields_use_the_packed_encoding_tensorflow_reads():
    arr = rng.random(10_000, dtype=np.float32)
    proto = to_tensor_proto(arr)
    assert len(proto.float_val) == arr.size
    assert np.array_equal(tf.make_ndarray(proto), arr)
    assert np.array_equal(to_ndarray(tensor_pb2.TensorProto.FromString(proto.SerializeToString())), arr)


def test_one_value_fills_the_shape():
    assert to_ndarray(tf.make_tensor_proto(0.5, shape=[2, 2])).tolist() == [[0.5, 0.5], [0.5, 0.5]]
    strings = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[b"x"])
    strings.tensor_shape.dim.add(size=3)
    assert to_ndarray(strings).tolist() == [b"x", b"x", b"x"]


def bad(**fields) -> tensor_pb2.TensorProto:
    dims = fields.pop("dims", [3])
    proto = tensor_pb2.TensorProto(**fields)
    for size in dims:
        proto.tensor_shape.dim.add(size=size)
    return proto


@pytest.mark.parametrize(
    ("proto", "words"),
    [
        (bad(dtype=types_pb2.DT_FLOAT, float_val=[1, 2]), ["holds 3 values", "float_val has 2"]),
        (bad(dtype=types_pb2.DT_FLOAT), ["float_val has 0"]),
        (bad(dtype=types_pb2.DT_FLOAT, tensor_content=b"abc"), ["tensor_content has 3 bytes", "needs 12"]),
        (bad(dtype=types_pb2.DT_RESOURCE), ["DT_RESOURCE"]),
        (bad(dtype=types_pb2.DT_INVALID), ["DT_INVALID"]),
        (bad(dtype=types_pb2.DT_INT8, int_val=[300, 1, 2]), ["300", "int8"]),
        (bad(dtype=types_pb2.DT_FLOAT, float_val=[1], dims=[-1]), ["unknown (-1) dimension"]),
        (bad(dtype=types_pb2.DT_STRING, tensor_content=b"abc"), ["string_val"]),
        (bad(dtype=types_pb2.DT_FLOAT, float_val=[1], dims=[MAX_FILL_BYTES, 2]), ["MiB"]),
    ],
)
def test_invalid_tensors_are_invalid_argument_naming_the_input(proto, words):
    with pytest.raises(InvalidArgument) as info:
        to_ndarray(proto, "input 'x'")
    assert "input 'x'" in info.value.message
    for word in words:
        assert word in info.value.message
