"""TensorProto ⇄ numpy, as TF Serving's gRPC API carries tensors.

Numbers come back in the typed value fields (`float_val`, `int64_val`, …), as TF Serving
answers by default, so clients reading `response.outputs["y"].float_val` work. Requests may
use either `tensor_content` or the typed fields (one value fills the whole shape). Fixed-width
fields (float, double, complex) skip Python's per-value loop: their packed wire bytes are the
array's bytes, read and written with numpy (see docs/decisions.md for the measurement).
DT_STRING tensors are numpy `object` arrays of `bytes`. Malformed tensors → InvalidArgument.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from tensorflow.core.framework import tensor_pb2, types_pb2

from tfservo.codecs.dims import element_count
from tfservo.codecs.wire import WIRE_LEN, key, read_varint
from tfservo.codecs.wire import field as field_bytes
from tfservo.core.errors import Internal, InvalidArgument

__all__ = [
    "MAX_FILL_BYTES",
    "dtype_name",
    "TensorProto",
    "to_ndarray",
    "to_tensor_proto",
    "write_tensor_proto",
]

try:  # ships with TensorFlow; numpy itself has no bfloat16
    from ml_dtypes import bfloat16 as _BFLOAT16
except ImportError:  # pragma: no cover
    _BFLOAT16 = None

if TYPE_CHECKING:
    TensorProto = Any  # the generated proto class is untyped
else:
    TensorProto = tensor_pb2.TensorProto

# One tensor a request may make by filling a shape from a single value; bigger ones must be sent.
MAX_FILL_BYTES = 256 * 2**20
_MAX_RANK = 64  # numpy's limit
# Below this many values the plain protobuf path is as fast as reading the wire bytes.
_FAST_MIN_VALUES = 64

# TensorProto field numbers of the fixed-width packed value fields.
_FLOAT_VAL, _DOUBLE_VAL, _SCOMPLEX_VAL, _DCOMPLEX_VAL = 5, 6, 9, 12

# DataType → (numpy dtype, value field); None for types TF Serving clients cannot send as numbers.
_DECODE: dict[int, tuple[Any, str]] = {
    types_pb2.DT_FLOAT: (np.dtype("<f4"), "float_val"),
    types_pb2.DT_DOUBLE: (np.dtype("<f8"), "double_val"),
    types_pb2.DT_INT32: (np.dtype("<i4"), "int_val"),
    types_pb2.DT_UINT8: (np.dtype("u1"), "int_val"),
    types_pb2.DT_INT16: (np.dtype("<i2"), "int_val"),
    types_pb2.DT_INT8: (np.dtype("i1"), "int_val"),
    types_pb2.DT_UINT16: (np.dtype("<u2"), "int_val"),
    types_pb2.DT_INT64: (np.dtype("<i8"), "int64_val"),
    types_pb2.DT_UINT32: (np.dtype("<u4"), "uint32_val"),
    types_pb2.DT_UINT64: (np.dtype("<u8"), "uint64_val"),
    types_pb2.DT_BOOL: (np.dtype("?"), "bool_val"),
    types_pb2.DT_HALF: (np.dtype("<f2"), "half_val"),
    types_pb2.DT_COMPLEX64: (np.dtype("<c8"), "scomplex_val"),
    types_pb2.DT_COMPLEX128: (np.dtype("<c16"), "dcomplex_val"),
    types_pb2.DT_STRING: (np.dtype(object), "string_val"),
}
if _BFLOAT16 is not None:
    _DECODE[types_pb2.DT_BFLOAT16] = (np.dtype(_BFLOAT16), "half_val")

_PACKED_FIELD = {"float_val": _FLOAT_VAL, "double_val": _DOUBLE_VAL, "scomplex_val": _SCOMPLEX_VAL,
                 "dcomplex_val": _DCOMPLEX_VAL}
_PART = {"float_val": "<f4", "double_val": "<f8", "scomplex_val": "<f4", "dcomplex_val": "<f8"}  # one number
_ENCODE: dict[np.dtype, int] = {np_dtype.newbyteorder("="): dt for dt, (np_dtype, _) in _DECODE.items()}


def dtype_name(dtype: int) -> str:
    """`DT_FLOAT` for 1, or the number when TensorFlow has no name for it."""
    try:
        return str(types_pb2.DataType.Name(dtype))
    except ValueError:
        return str(dtype)


# -- proto → numpy -----------------------------------------------------------------------------


def to_ndarray(proto: TensorProto, name: str = "tensor", max_fill_bytes: int = MAX_FILL_BYTES) -> np.ndarray:
    """The array a TensorProto describes; `name` (e.g. "input 'x'") is used in error messages.
    One value filling a shape may expand to at most `max_fill_bytes`, checked before allocating."""
    spec = _DECODE.get(proto.dtype)
    if spec is None:
        raise InvalidArgument(
            f"{name} has dtype {dtype_name(proto.dtype)}, which tfservo cannot read from a request; "
            f"use one of {', '.join(sorted(dtype_name(d) for d in _DECODE))}"
        )
    np_dtype, field = spec
    shape = _shape(proto, name)
    count = element_count(shape, name)
    if proto.tensor_content:
        if proto.dtype == types_pb2.DT_STRING:
            raise InvalidArgument(f"{name} is DT_STRING but uses tensor_content; send its values in string_val")
        content = proto.tensor_content
        if len(content) != count * np_dtype.itemsize:
            raise InvalidArgument(
                f"{name}: tensor_content has {len(content)} bytes, but shape {list(shape)} of "
                f"{dtype_name(proto.dtype)} needs {count * np_dtype.itemsize}; send the tensor's raw "
                "little-endian bytes, or its values in the typed field"
            )
        return np.frombuffer(content, dtype=np_dtype).reshape(shape)
    values = _values(proto, field, np_dtype, name)
    return _fill(values, shape, count, proto.dtype, field, name, max_fill_bytes)


def _shape(proto: TensorProto, name: str) -> tuple[int, ...]:
    if proto.tensor_shape.unknown_rank:
        raise InvalidArgument(f"{name} has an unknown rank; set tensor_shape to the tensor's dimensions")
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    if len(shape) > _MAX_RANK:
        raise InvalidArgument(f"{name} has {len(shape)} dimensions; tensors here have at most {_MAX_RANK}")
    if any(d < 0 for d in shape):
        raise InvalidArgument(
            f"{name} has shape {list(shape)} with an unknown (-1) dimension; send the actual dimensions"
        )
    return shape


def _values(proto: TensorProto, field: str, np_dtype: np.dtype, name: str) -> np.ndarray:
    """The typed field's values as a flat array of the tensor's dtype."""
    repeated = getattr(proto, field)
    n = len(repeated)
    if field == "string_val":
        out = np.empty(n, dtype=object)
        out[:] = list(repeated)
        return out
    if field in _PACKED_FIELD:
        part = np.dtype(_PART[field])
        raw = _packed_bytes(proto, _PACKED_FIELD[field]) if n >= _FAST_MIN_VALUES else None
        flat = np.frombuffer(raw, dtype=part) if raw is not None else np.array(repeated, dtype=part)
        if np_dtype.kind == "c":
            if flat.size % 2:
                raise InvalidArgument(
                    f"{name}: {field} has {flat.size} numbers; complex values need real and imaginary parts"
                )
            return flat.view(np_dtype)
        return flat
    if field == "half_val":
        bits = np.fromiter(repeated, dtype=np.int64, count=n)
        if n and (bits.min() < 0 or bits.max() > 0xFFFF):
            raise InvalidArgument(f"{name}: half_val holds values outside 0..65535; send 16-bit patterns")
        return bits.astype(np.uint16).view(np_dtype)
    if field == "bool_val":
        return np.fromiter(repeated, dtype=bool, count=n)
    wide = np.dtype(np.uint64) if np_dtype.kind == "u" and np_dtype.itemsize == 8 else np.dtype(np.int64)
    ints = np.fromiter(repeated, dtype=wide, count=n)
    if np_dtype.itemsize < 8 and n:
        info = np.iinfo(np_dtype)
        lo, hi = int(ints.min()), int(ints.max())
        if lo < info.min or hi > info.max:
            raise InvalidArgument(
                f"{name}: {field} holds {lo if lo < info.min else hi}, outside the range of "
                f"{np_dtype.name} ({info.min}..{info.max})"
            )
    return ints.astype(np_dtype)


def _fill(
    values: np.ndarray, shape: tuple[int, ...], count: int, dtype: int, field: str, name: str, max_fill_bytes: int
) -> np.ndarray:
    n = values.size
    if n == count:
        return values.reshape(shape)
    if n == 1:  # TF's rule, and what tf.make_tensor_proto(0.5, shape=[3]) sends
        if count * values.itemsize > max_fill_bytes:
            raise InvalidArgument(
                f"{name}: one value would fill shape {list(shape)} ({count} values), over the "
                f"{max_fill_bytes // 2**20} MiB a request may expand to (--max-request-mb, at least "
                f"{MAX_FILL_BYTES // 2**20}); send a smaller shape"
            )
        out = np.empty(count, dtype=values.dtype)
        out[:] = values[0]
        return out.reshape(shape)
    raise InvalidArgument(
        f"{name}: shape {list(shape)} of {dtype_name(dtype)} holds {count} values, but {field} has {n}; "
        f"send {count} values (or one to fill the tensor)"
    )


def _packed_bytes(proto: TensorProto, field_number: int) -> bytes | None:
    """The concatenated packed payloads of a fixed-width field; None if it was sent unpacked."""
    data = proto.SerializeToString()
    chunks: list[bytes] = []
    pos, end = 0, len(data)
    while pos < end:
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = read_varint(data, pos)
        elif wire == 1:
            if number == field_number:
                return None
            pos += 8
        elif wire == WIRE_LEN:
            size, pos = read_varint(data, pos)
            if number == field_number:
                chunks.append(data[pos : pos + size])
            pos += size
        elif wire == 5:
            if number == field_number:
                return None
            pos += 4
        else:
            return None
    return b"".join(chunks)


# -- numpy → proto -----------------------------------------------------------------------------


def write_tensor_proto(value: object, out: TensorProto, name: str = "tensor") -> TensorProto:
    """Fill `out` (e.g. `response.outputs[key]`) with `value` in TF Serving's typed fields."""
    arr = np.asarray(value)
    if arr.dtype.kind in "OSU":
        return _write_strings(arr, out, name)
    dtype = _ENCODE.get(arr.dtype.newbyteorder("="))
    if dtype is None:
        raise Internal(f"{name} has numpy dtype {arr.dtype}, which has no TensorFlow DataType to send it as")
    out.dtype = dtype
    _write_shape(arr, out)
    field = _DECODE[dtype][1]
    if field in _PACKED_FIELD and (arr.size >= _FAST_MIN_VALUES or arr.dtype.kind == "c"):
        part = _PART[field]
        flat = np.ascontiguousarray(arr).reshape(-1)
        if flat.dtype.kind == "c":
            flat = flat.astype("<c16" if part == "<f8" else "<c8", copy=False).view(part)
        payload = flat.astype(part, copy=False).tobytes()
        if payload:
            out.MergeFromString(field_bytes(key(_PACKED_FIELD[field]), payload))
    elif field == "half_val":
        out.half_val.extend(arr.reshape(-1).view(np.uint16).tolist())
    else:
        getattr(out, field).extend(arr.reshape(-1).tolist())
    return out


def to_tensor_proto(value: object, name: str = "tensor") -> TensorProto:
    """A new TensorProto holding `value` (see write_tensor_proto)."""
    return write_tensor_proto(value, TensorProto(), name)


def _write_shape(arr: np.ndarray, out: TensorProto) -> None:
    for size in arr.shape:
        out.tensor_shape.dim.add(size=size)


def _write_strings(arr: np.ndarray, out: TensorProto, name: str) -> TensorProto:
    out.dtype = types_pb2.DT_STRING
    _write_shape(arr, out)
    values = []
    for item in arr.reshape(-1).tolist():
        if isinstance(item, bytes):
            values.append(item)
        elif isinstance(item, str):
            values.append(item.encode("utf-8"))
        else:
            raise Internal(
                f"{name} holds a {type(item).__name__} among its string values; "
                "a DT_STRING output must hold bytes or str"
            )
    out.string_val.extend(values)
    return out
