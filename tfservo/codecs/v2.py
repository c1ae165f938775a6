"""V2 tensors ↔ numpy arrays: JSON `data` (flat or nested, row-major) and the binary tensor
data extension (raw little-endian bytes after the JSON header; BYTES elements each prefixed
by their length as a 4-byte little-endian integer)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tfservo.codecs.dims import element_count
from tfservo.core.errors import InvalidArgument

__all__ = ["DTYPE_OF_V2", "V2_OF_TF", "SharedRead", "SharedSpan", "SharedWrite", "V2Error", "decode_inputs",
           "encode_outputs", "shared_span", "v2_datatype"]


class V2Error(InvalidArgument):
    """A request that is not valid V2: 400 / INVALID_ARGUMENT."""


DTYPE_OF_V2: dict[str, np.dtype] = {
    "BOOL": np.dtype(bool), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
V2_OF_TF = {
    "DT_BOOL": "BOOL", "DT_UINT8": "UINT8", "DT_UINT16": "UINT16", "DT_UINT32": "UINT32", "DT_UINT64": "UINT64",
    "DT_INT8": "INT8", "DT_INT16": "INT16", "DT_INT32": "INT32", "DT_INT64": "INT64", "DT_HALF": "FP16",
    "DT_FLOAT": "FP32", "DT_DOUBLE": "FP64", "DT_STRING": "BYTES", "DT_BFLOAT16": "BF16",
}


@dataclass(frozen=True)
class SharedSpan:
    """Where a tensor lies in a registered shared-memory region (the system shared-memory
    extension's `shared_memory_region`, `shared_memory_offset`, `shared_memory_byte_size`)."""

    region: str
    offset: int
    byte_size: int


# Read or write a span of a registered region for the tensor named last (the data plane's regions).
SharedRead = Callable[[SharedSpan, str], bytes]
SharedWrite = Callable[[SharedSpan, bytes, str], None]


def shared_span(params: Mapping[str, object], what: str) -> SharedSpan | None:
    """The shared-memory span a tensor's parameters name, None when they name none."""
    region = params.get("shared_memory_region")
    if region is None:
        return None
    size, offset = params.get("shared_memory_byte_size"), params.get("shared_memory_offset", 0)
    if not isinstance(region, str) or not region:
        raise V2Error(f"{what}: shared_memory_region must be a region's name, got {region!r}")
    for field, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise V2Error(f"{what}: {field} must be a non-negative integer with shared_memory_region, got {value!r}")
    assert isinstance(offset, int) and isinstance(size, int)
    return SharedSpan(region, offset, size)


def v2_datatype(array: np.ndarray) -> str:
    if array.dtype.kind in "OSU":
        return "BYTES"
    for name, dtype in DTYPE_OF_V2.items():
        if dtype == array.dtype and name != "BYTES":
            return name
    raise V2Error(f"an output of dtype {array.dtype} has no V2 datatype")


def parameters_of(holder: dict[str, object], what: str) -> dict[str, object]:
    """A V2 object's "parameters" (absent or null: none), or V2Error when it is not an object."""
    params = holder.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise V2Error(f'"parameters" of {what} must be an object, got {type(params).__name__}')
    return params


def decode_inputs(inputs: object, binary: bytes = b"", shared: SharedRead | None = None) -> dict[str, np.ndarray]:
    """The request's `inputs` list (and the binary part after its JSON) → {name: array}; an
    input in shared memory is read through `shared` (None: the server has the extension off)."""
    if not isinstance(inputs, list) or not inputs:
        raise V2Error('"inputs" must be a non-empty list of tensors ({"name", "shape", "datatype", "data"})')
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for i, tensor in enumerate(inputs):
        if not isinstance(tensor, dict):
            raise V2Error(f"input {i} must be an object with name, shape, datatype and data")
        name, shape, datatype = tensor.get("name"), tensor.get("shape"), tensor.get("datatype")
        if not isinstance(name, str) or not name:
            raise V2Error(f"input {i} has no name")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise V2Error(f"input {name}: shape must be a list of non-negative integers, got {shape!r}")
        element_count(shape, f"input {name}")
        if not isinstance(datatype, str) or datatype not in DTYPE_OF_V2:
            raise V2Error(f"input {name}: datatype {datatype!r} is not one tfservo takes; use one of {', '.join(DTYPE_OF_V2)}")
        params = parameters_of(tensor, f"input {name}")
        size = params.get("binary_data_size")
        span = shared_span(params, f"input {name}")
        if span is not None:
            if size is not None or "data" in tensor:
                raise V2Error(f"input {name}: data in shared memory must not also come in the request "
                              "(data or binary_data_size)")
            if shared is None:
                raise V2Error(f"input {name}: this server does not take shared memory (--shared-memory off); "
                              "send the tensor in the request")
            arrays[name] = _from_binary(name, shared(span, f"input {name}"), shape, datatype)
        elif size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
                raise V2Error(f"input {name}: binary_data_size {size!r} runs past the {len(binary)} binary bytes sent")
            arrays[name] = _from_binary(name, binary[offset:offset + size], shape, datatype)
            offset += size
        else:
            if "data" not in tensor:
                raise V2Error(f"input {name} has neither data nor parameters.binary_data_size")
            arrays[name] = _from_json(name, tensor["data"], shape, datatype)
    if offset != len(binary):
        raise V2Error(f"{len(binary) - offset} binary bytes were sent that no input's binary_data_size claims")
    return arrays


def _count(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def _from_json(name: str, data: object, shape: list[int], datatype: str) -> np.ndarray:
    flat = _flatten(data)
    if len(flat) != _count(shape):
        raise V2Error(f"input {name}: {len(flat)} values for shape {shape} ({_count(shape)} values)")
    if datatype == "BYTES":
        values = np.empty(len(flat), dtype=object)
        for j, v in enumerate(flat):
            if not isinstance(v, str):
                raise V2Error(f"input {name}: BYTES data must be strings, got {type(v).__name__}")
            values[j] = v.encode("utf-8")
        return values.reshape(shape)
    try:
        array = np.asarray(flat, dtype=DTYPE_OF_V2[datatype])
    except (TypeError, ValueError, OverflowError) as exc:
        raise V2Error(f"input {name}: data is not {datatype} ({exc})") from None
    if datatype == "BOOL" and not all(isinstance(v, bool) for v in flat):
        raise V2Error(f"input {name}: BOOL data must be true/false")
    return array.reshape(shape)


def _flatten(data: object) -> list[object]:
    if not isinstance(data, list):
        return [data]
    out: list[object] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _from_binary(name: str, raw: bytes, shape: list[int], datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        values, pos = [], 0
        while pos < len(raw):
            if pos + 4 > len(raw):
                raise V2Error(f"input {name}: BYTES binary data ends inside a length prefix")
            (length,) = struct.unpack_from("<I", raw, pos)
            pos += 4
            if pos + length > len(raw):
                raise V2Error(f"input {name}: a BYTES element of {length} bytes runs past its binary data")
            values.append(raw[pos:pos + length])
            pos += length
        if len(values) != _count(shape):
            raise V2Error(f"input {name}: {len(values)} BYTES elements for shape {shape}")
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array.reshape(shape)
    dtype = DTYPE_OF_V2[datatype].newbyteorder("<")
    if len(raw) != _count(shape) * dtype.itemsize:
        raise V2Error(f"input {name}: {len(raw)} bytes for shape {shape} of {datatype} "
                      f"({_count(shape) * dtype.itemsize} expected)")
    return np.frombuffer(raw, dtype=dtype).astype(DTYPE_OF_V2[datatype]).reshape(shape)


def encode_outputs(
    outputs: Mapping[str, np.ndarray], binary: Mapping[str, bool],
    parameters: Mapping[str, Mapping[str, object]] | None = None, write: SharedWrite | None = None,
) -> tuple[list[dict[str, object]], list[bytes | None]]:
    """{name: array} → the response's `outputs` list, and the binary parts (in order) of the
    outputs whose `binary[name]` is true; an output whose requested `parameters` name a
    shared-memory span is written there through `write` instead (its part None), its entry naming
    the region and the bytes written."""
    listed: list[dict[str, object]] = []
    parts: list[bytes | None] = []
    for name, value in outputs.items():
        array = np.asarray(value)
        datatype = v2_datatype(array)
        entry: dict[str, object] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        span = shared_span(parameters[name], f"output {name}") if parameters and name in parameters else None
        if span is not None:
            if write is None:
                raise V2Error(f"output {name}: this server does not take shared memory (--shared-memory off)")
            raw = _to_binary(array, datatype)
            write(span, raw, name)
            entry["parameters"] = {"shared_memory_region": span.region, "shared_memory_byte_size": len(raw)}
            if binary.get(name):
                parts.append(None)  # keeps gRPC's raw_output_contents one per output
        elif binary.get(name):
            raw = _to_binary(array, datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            parts.append(raw)
        elif datatype == "BYTES":
            entry["data"] = [_text(v) for v in array.reshape(-1)]
        else:
            entry["data"] = array.reshape(-1).tolist()
        listed.append(entry)
    return listed, parts


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _to_binary(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        chunks = []
        for v in array.reshape(-1):
            b = v if isinstance(v, bytes) else str(v).encode("utf-8")
            chunks += [struct.pack("<I", len(b)), b]
        return b"".join(chunks)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
