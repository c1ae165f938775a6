"""TF Serving's REST JSON ⇄ numpy arrays: predict rows/columns, b64 strings, classify/regress bodies.

Follows tensorflow_serving/util/json_tensor.cc: the same request rules, TF Serving's error wording
(plus what to do about it), and the same pretty-printed response layout as its rapidjson
PrettyWriter. Numeric tensors go through orjson and numpy, never per-element Python, unless a
request is malformed and a precise error message has to be found.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import chain
from typing import Any, TypeGuard

import numpy as np
import orjson

from tfservo.codecs.json_arrays import NumericTensor, parse_numeric_request
from tfservo.core.errors import InvalidArgument, ServingError, Unimplemented
from tfservo.models.calls import Answer, Classification, PredictCall, Prediction
from tfservo.models.signatures import DEFAULT_SIGNATURE, SignatureDef

__all__ = [
    "MAX_DEPTH",
    "ExampleRequest",
    "JsonSyntaxError",
    "PredictRequest",
    "decode_b64",
    "decode_classify_regress_request",
    "decode_predict_request",
    "encode_answer",
    "encode_classify_response",
    "encode_predict_response",
    "encode_regress_response",
    "error_body",
    "is_b64",
    "json_type",
    "load_json",
    "parse_json",
    "parse_numeric",
    "parse_request",
    "render_value",
]

MAX_DEPTH = 512  # deepest JSON nesting accepted, well inside Python's recursion limit
_MAX_RANK = 64  # numpy arrays have at most 64 dimensions (TensorShape allows 254)
_RENDER_LIMIT = 200  # characters of a JSON value quoted in an error message

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
_NUMPY_INDENT = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_INDENT_2
_BOM = b"\xef\xbb\xbf"
_NONFINITE = re.compile(r"\b(?:NaN|-?Infinity)\b")
_NULL = re.compile(rb"null")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


# A decoded `:predict` body: which signature, its input arrays, and the format to answer in.
PredictRequest = PredictCall


@dataclass(frozen=True)
class ExampleRequest:
    """A decoded `:classify` / `:regress` body: JSON examples plus an optional shared context."""

    signature_name: str
    examples: list[dict[str, object]]
    context: dict[str, object] | None


# -- dtypes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _DType:
    """How JSON values become one TF dtype: numpy type, TF's short name, and the accepted range."""

    np_type: type
    tf_name: str
    family: str  # "float" | "int" | "bool" | "string"
    lo: float = 0  # ints: smallest value; floats: unused
    hi: float = 0  # ints: largest value; floats: largest finite magnitude
    exact_int: int = 0  # floats: largest integer stored without loss (TF Serving's kMaxInt)


def _int_dtype(np_type: type, tf_name: str) -> _DType:
    info = np.iinfo(np_type)
    return _DType(np_type, tf_name, "int", int(info.min), int(info.max))


def _float_dtype(np_type: type, tf_name: str) -> _DType:
    info = np.finfo(np_type)
    return _DType(np_type, tf_name, "float", hi=float(info.max), exact_int=2 ** (info.nmant + 1) - 1)


_DTYPES: dict[str, _DType] = {
    "DT_FLOAT": _float_dtype(np.float32, "float"),
    "DT_DOUBLE": _float_dtype(np.float64, "double"),
    "DT_HALF": _float_dtype(np.float16, "half"),
    "DT_INT8": _int_dtype(np.int8, "int8"),
    "DT_INT16": _int_dtype(np.int16, "int16"),
    "DT_INT32": _int_dtype(np.int32, "int32"),
    "DT_INT64": _int_dtype(np.int64, "int64"),
    "DT_UINT8": _int_dtype(np.uint8, "uint8"),
    "DT_UINT16": _int_dtype(np.uint16, "uint16"),
    "DT_UINT32": _int_dtype(np.uint32, "uint32"),
    "DT_UINT64": _int_dtype(np.uint64, "uint64"),
    "DT_BOOL": _DType(np.bool_, "bool", "bool"),
    "DT_STRING": _DType(object, "string", "string"),
}
_FAST_TYPES: dict[str, frozenset[type]] = {
    "float": frozenset({float, int}),
    "int": frozenset({int}),
    "bool": frozenset({bool}),
}


def _dtype(tf_dtype: str, input_name: str) -> _DType:
    dt = _DTYPES.get(tf_dtype)
    if dt is None:
        raise Unimplemented(
            f"Conversion of JSON values to type {tf_dtype} (input '{input_name}') is not supported; "
            f"JSON requests can only carry {', '.join(sorted(_DTYPES))} inputs"
        )
    return dt


# -- parsing -----------------------------------------------------------------------------------


class JsonSyntaxError(InvalidArgument):
    """A body that is not one JSON document; `msg`, `pos`, `lineno` and `colno` say where."""

    def __init__(self, msg: str, pos: int, lineno: int, colno: int) -> None:
        super().__init__(f"{msg} at offset {pos} (line {lineno}, column {colno})")
        self.msg, self.pos, self.lineno, self.colno = msg, pos, lineno, colno


def load_json(body: bytes | bytearray | memoryview | str) -> object:
    """The one JSON loader: orjson, with the NaN/Infinity tokens TF Serving also accepts, a
    leading byte order mark skipped, and nesting limited to MAX_DEPTH.

    Not JSON → JsonSyntaxError; too deep or not UTF-8 → InvalidArgument saying so.
    """
    body = _without_bom(body)
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        doc = _parse_fallback(body, err)
    if _too_deep(body, doc):
        raise _too_deep_error()
    return doc


def parse_json(body: bytes | bytearray | memoryview | str) -> Any:
    """Parse a request body; any malformed, empty, non-UTF-8 or too deeply nested body → InvalidArgument."""
    body = _without_bom(body)
    if not body.strip():
        raise InvalidArgument(
            "JSON Parse error: The document is empty; send a JSON object as the request body"
        )
    try:
        return load_json(body)
    except JsonSyntaxError as err:
        raise InvalidArgument(
            f"JSON Parse error: {err.msg} at offset: {err.pos} (line {err.lineno} column {err.colno}); "
            "the request body must be one valid JSON document"
        ) from None


def _without_bom(body: bytes | bytearray | memoryview | str) -> bytes:
    """UTF-8 bytes without a leading byte order mark (rapidjson's UTF-8 stream skips one; so do we)."""
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else bytes(body)
    return data[len(_BOM) :] if data.startswith(_BOM) else data


_FAST_PARSE_BYTES = 1024  # below this, orjson's plain parse is as quick as the numeric path


def parse_numeric(body: bytes) -> dict[str, object] | None:
    """A predict body that is only numeric arrays, with them as NumericTensors (json_arrays);
    None for any other body (or one too small to gain from it)."""
    if len(body) < _FAST_PARSE_BYTES:
        return None
    return parse_numeric_request(body)


def parse_request(body: bytes | bytearray | memoryview | str) -> object:
    """A REST request body parsed once: numeric arrays straight to NumericTensors when the body
    is only that, else parse_json's Python objects."""
    if isinstance(body, (bytes, bytearray)):
        fast = parse_numeric(bytes(body))
        if fast is not None:
            return fast
    return parse_json(body)


def _parse_fallback(body: bytes, err: orjson.JSONDecodeError) -> object:
    """Second chance for what orjson refuses but TF Serving accepts (NaN/Infinity); else a clear error."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as bad:
        raise InvalidArgument(
            f"JSON Parse error: the body is not valid UTF-8 (byte 0x{body[bad.start]:02x} at offset "
            f"{bad.start}); send UTF-8 JSON and base64-encode binary values as {{\"b64\": \"...\"}}"
        ) from None
    if _NONFINITE.search(text):
        try:
            return json.loads(text)  # the stdlib parser accepts NaN, Infinity and -Infinity
        except RecursionError:
            raise _too_deep_error() from None
        except ValueError:
            pass
    if "depth" in err.msg or "recursion" in err.msg.lower():
        raise _too_deep_error()
    raise JsonSyntaxError(err.msg, err.pos, err.lineno, err.colno)


def _too_deep_error() -> InvalidArgument:
    return InvalidArgument(
        f"JSON Parse error: the document is nested more than {MAX_DEPTH} levels deep; "
        f"flatten the request (tensors have at most {_MAX_RANK} dimensions here)"
    )


def _too_deep(body: bytes, doc: object) -> bool:
    """True when `doc` nests deeper than MAX_DEPTH; cheap unless the body has many brackets."""
    if body.count(b"[") + body.count(b"{") <= MAX_DEPTH:
        return False
    brackets = np.frombuffer(body.translate(None, _NOT_BRACKETS), dtype=np.uint8)
    # Counting brackets inside strings too: "[" there makes the estimate too high (the exact walk
    # below settles it), "]" too low (then orjson's own 1024-level limit is the backstop).
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1)
    if int(np.cumsum(steps).max()) <= MAX_DEPTH:
        return False
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((v, depth + 1) for v in children if isinstance(v, (list, dict)))
    return False


# -- rendering values in messages -------------------------------------------------------------


def render_value(value: object) -> str:
    """A short JSON rendering of a value for an error message (TF Serving's JsonValueToString)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    try:
        text = orjson.dumps(value).decode("utf-8")
    except (orjson.JSONEncodeError, TypeError):
        text = "<value too deeply nested to show>"
    if len(text) > _RENDER_LIMIT:
        text = text[:_RENDER_LIMIT] + f"... ({len(text)} characters)"
    return text


def json_type(value: object) -> str:
    """rapidjson's name for a JSON value's type, as TF Serving's messages use it."""
    if value is None:
        return "Null"
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    if isinstance(value, str):
        return "String"
    return "Number"


def _format_error(doc: object, what: str) -> InvalidArgument:
    return InvalidArgument(f"JSON Value: {render_value(doc)} {what}")


# -- predict requests --------------------------------------------------------------------------


def decode_predict_request(doc: object, signature_of: Callable[[str], SignatureDef]) -> PredictRequest:
    """A parsed `:predict` body → named input arrays, by TF Serving's row/columnar rules."""
    if not isinstance(doc, dict):
        raise _format_error(doc, "Is not object; the request body must be a JSON object")
    signature_name = _signature_name(doc)
    signature = signature_of(signature_name)
    if not signature.inputs:
        raise InvalidArgument(f"Failed to get input map for signature: {signature_name}")
    has_instances, has_inputs = "instances" in doc, "inputs" in doc
    if has_instances and has_inputs:
        raise _format_error(
            doc, "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist"
        )
    if has_instances:
        instances = doc["instances"]
        if not isinstance(instances, (list, np.ndarray, NumericTensor)):  # arrays: from an input_handler, in-process
            raise _format_error(doc, "Excepting 'instances' to be an list/array")
        if len(instances) == 0:
            raise _format_error(doc, "No values in 'instances' array; send at least one instance")
        return PredictCall(signature_name, _decode_instances(instances, signature), True, None, signature)
    if has_inputs:
        return PredictCall(signature_name, _decode_inputs(doc["inputs"], signature), False, None, signature)
    raise InvalidArgument(
        "Missing 'inputs' or 'instances' key; send {\"instances\": [...]} (row format) or "
        "{\"inputs\": ...} (columnar format)"
    )


def _signature_name(doc: dict[str, object]) -> str:
    name = doc.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(name, str):
        raise _format_error(doc, "not formatted correctly. 'signature_name' key must be a string value.")
    return name or DEFAULT_SIGNATURE


def is_b64(value: object) -> TypeGuard[dict[str, str]]:
    """True for {"b64": "<string>"}, TF Serving's spelling of a binary value."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _is_named_object(value: object) -> TypeGuard[dict[str, object]]:
    return isinstance(value, dict) and not is_b64(value)


def _decode_instances(instances: list[Any] | np.ndarray | NumericTensor, signature: SignatureDef) -> dict[str, np.ndarray]:
    """Row format: every instance gives one batch row of each input."""
    names = sorted(signature.inputs)
    if isinstance(instances, NumericTensor) or not _is_named_object(instances[0]):
        if len(names) > 1:
            raise InvalidArgument(
                "instances is a plain list, but expecting list of objects as multiple input tensors "
                "required as per tensorinfo_map; send each instance as an object with keys "
                f"{', '.join(names)}"
            )
        for i, item in enumerate(() if isinstance(instances, NumericTensor) else instances):
            if _is_named_object(item):
                raise InvalidArgument(f"Expecting value/list but got object at item {i} of input list")
        name = names[0]
        return {name: _rows_to_array(instances, signature.inputs[name].dtype, name, keyed=False)}

    for i, item in enumerate(instances):
        if not _is_named_object(item):
            raise InvalidArgument(
                f"Expecting object but got {json_type(item).lower()} at item {i} of input list; "
                "either every instance is an object keyed by input name or none is"
            )
        for key in item:
            if key not in signature.inputs:
                raise InvalidArgument(
                    f"Failed to process element: {i} key: {key} of 'instances' list. Error: Invalid "
                    f"argument: JSON object: does not have named input: {key}; the inputs of signature "
                    f"{signature.name} are: {', '.join(names)}"
                )
        if len(item) != len(names):
            missing = [n for n in names if n not in item]
            raise InvalidArgument(
                f"Failed to process element: {i} of 'instances' list. JSON object: {render_value(item)} keys "
                f"must be equal to: {','.join(names)} (missing: {', '.join(missing)})"
            )
    return {
        name: _rows_to_array(
            [item[name] for item in instances], signature.inputs[name].dtype, name, keyed=True
        )
        for name in names
    }


def _rows_to_array(rows: list[object] | np.ndarray | NumericTensor, tf_dtype: str, name: str, *, keyed: bool) -> np.ndarray:
    """Batch the instances' values of one input into one array (first dimension = instance)."""
    dt = _dtype(tf_dtype, name)
    if isinstance(rows, NumericTensor):
        numeric = _from_numbers(rows.values, dt)
        if numeric is not None:
            return numeric
        rows = rows.as_json()  # not plainly convertible: the general path judges it, and says why
    if isinstance(rows, np.ndarray):
        return _from_ndarray(rows, dt, name)
    assert isinstance(rows, list)
    shape = _dense_shape(rows, name)
    fast = _fast_array(rows, shape, dt)
    if fast is not None:
        return fast
    # Slow path: per instance, so the message names the instance TF Serving would name.
    flat: list[object] = []
    first_shape: list[int] | None = None
    for i, row in enumerate(rows):
        where = f"element: {i} key: {name}" if keyed else f"element: {i}"
        try:
            row_shape = _dense_shape(row, name)
            count = len(flat)
            _fill(row, 0, row_shape, dt, flat)
            if first_shape is None:
                first_shape = row_shape
            elif _size(first_shape) != len(flat) - count:
                raise InvalidArgument(
                    f"Expecting tensor size: {_size(first_shape)} but got: {len(flat) - count}; every "
                    "instance must have the same shape"
                )
            elif first_shape != row_shape:
                raise InvalidArgument(
                    f"Expecting shape {_shape_str(first_shape)} but got: {_shape_str(row_shape)}; every "
                    "instance must have the same shape"
                )
        except ServingError as err:
            raise InvalidArgument(
                f"Failed to process {where} of 'instances' list. Error: {_status_name(err)}: {err.message}"
            ) from None
    return _from_flat(flat, [len(rows), *(first_shape or [])], dt)


def _decode_inputs(value: object, signature: SignatureDef) -> dict[str, np.ndarray]:
    """Columnar format: one value (single input) or an object of values keyed by input name."""
    names = sorted(signature.inputs)
    if not _is_named_object(value):
        if len(names) > 1:
            raise InvalidArgument(
                "inputs is a plain value/list, but expecting an object as multiple input tensors "
                f"required as per tensorinfo_map; send an object with keys {', '.join(names)}"
            )
        return {names[0]: _input_to_array(value, signature.inputs[names[0]].dtype, names[0])}
    arrays: dict[str, np.ndarray] = {}
    for name in names:
        if name not in value:
            raise InvalidArgument(
                f"Missing named input: {name} in 'inputs' object; the inputs of signature "
                f"{signature.name} are: {', '.join(names)}"
            )
        # Like TF Serving, keys that are not inputs of the signature are ignored.
        arrays[name] = _input_to_array(value[name], signature.inputs[name].dtype, name)
    return arrays


def _input_to_array(value: object, tf_dtype: str, name: str) -> np.ndarray:
    dt = _dtype(tf_dtype, name)
    if isinstance(value, NumericTensor):
        numeric = _from_numbers(value.values, dt)
        if numeric is not None:
            return numeric
        value = value.as_json()
    if isinstance(value, np.ndarray):
        return _from_ndarray(value, dt, name)
    try:
        shape = _dense_shape(value, name)
        fast = _fast_array(value, shape, dt)
        if fast is not None:
            return fast
        flat: list[object] = []
        _fill(value, 0, shape, dt, flat)
        return _from_flat(flat, shape, dt)
    except InvalidArgument as err:
        raise InvalidArgument(f"Failed to process input: {name} of 'inputs'. Error: {err.message}") from None


def _dense_shape(value: object, name: str) -> list[int]:
    """The shape implied by following first elements down (TF Serving's GetDenseTensorShape)."""
    shape: list[int] = []
    while isinstance(value, list):
        shape.append(len(value))
        if len(shape) > _MAX_RANK:
            raise InvalidArgument(
                f"Input {name} is nested more than {_MAX_RANK} lists deep; tensors have at most "
                f"{_MAX_RANK} dimensions"
            )
        if not value:
            break
        value = value[0]
    return shape


def _fast_array(value: Any, shape: list[int], dt: _DType) -> np.ndarray | None:
    """Convert a well-formed all-number (or all-bool) nested list in C; None means 'use the slow path'."""
    allowed = _FAST_TYPES.get(dt.family)
    if allowed is None or not shape:
        return None
    leaves: Iterable[Any] = value
    for _ in range(len(shape) - 1):
        leaves = chain.from_iterable(leaves)
    try:
        types = set(map(type, leaves))
        if not types <= allowed:
            return None
        arr: np.ndarray
        if dt.family != "float":
            arr = np.array(value, dtype=dt.np_type)
        else:
            wide = np.array(value, dtype=np.float64)
            limit = dt.exact_int if int in types else dt.hi
            # NaN/inf compare False here, so they also take the slow path, which accepts them.
            if wide.size and not float(np.max(np.abs(wide))) <= limit:
                return None
            arr = wide if dt.np_type is np.float64 else wide.astype(dt.np_type)
    except (TypeError, ValueError, OverflowError):
        return None
    return arr if arr.shape == tuple(shape) else None


# The ufuncs' reduce, not ndarray.min/max: those add a Python-level wrapper (~1.5 µs each).
_lowest, _highest = np.minimum.reduce, np.maximum.reduce
_DOT_CHECK_MAX = 8192  # OpenBLAS (numpy's BLAS) ran dot products of 20 000 numbers on two threads, of 10 000 on one


def _from_numbers(values: np.ndarray, dt: _DType) -> np.ndarray | None:
    """A NumericTensor's values (int64: integer literals only; float64: not) as `dt`, when every
    value converts exactly as the JSON path would; None sends them down that path instead."""
    if dt.family == "float":
        if values.size and not _within(values, dt.exact_int):
            return None  # large values (or NaN): the JSON path decides between lossy ints and big floats
        return values.astype(dt.np_type, copy=False)
    if dt.family == "int" and values.dtype == np.int64:
        if values.size and not (dt.lo <= int(_lowest(values, axis=None)) and int(_highest(values, axis=None)) <= dt.hi):
            return None
        return values.astype(dt.np_type, copy=False)
    return None


def _within(values: np.ndarray, limit: int) -> bool:
    """Whether every value lies in [-limit, limit] (NaN does not).

    One BLAS call settles a small float64 array: no |value| passes the limit while the sum of
    squares stays within limit² (NaN, inf and overflow fail it too), and each numpy call costs
    ~4.5 µs on a request's cold caches, so the exact bounds wait for a sum that fails. Not for
    int64 (its dot product wraps around), nor past _DOT_CHECK_MAX numbers, where OpenBLAS splits
    the sum over threads that then spin, taking cores from the model."""
    if values.dtype == np.float64 and values.size <= _DOT_CHECK_MAX and float(np.vdot(values, values)) <= limit * limit:
        return True
    return -limit <= float(_lowest(values, axis=None)) and float(_highest(values, axis=None)) <= limit


def _fill(value: object, level: int, shape: list[int], dt: _DType, out: list[object]) -> None:
    """Check one nested value against `shape` and append its leaves (TF Serving's FillTensorProto)."""
    rank = len(shape)
    if not isinstance(value, list):
        if level != rank:
            raise InvalidArgument(
                f"JSON Value: {render_value(value)} found at incorrect level: {level + 1} in the JSON DOM. "
                f"Expected at level: {rank}; every list at one level must hold the same kind of items"
            )
        out.append(_scalar(value, dt))
        return
    if level >= rank:
        raise InvalidArgument(
            f"Encountered list at unexpected level: {level} expected < {rank}; lists must be nested "
            "to the same depth everywhere"
        )
    if len(value) != shape[level]:
        raise InvalidArgument(
            f"Encountered list at unexpected size: {len(value)} at level: {level} expected size: "
            f"{shape[level]}; ragged lists are not supported, every list at one level must have the "
            "same length"
        )
    for item in value:
        _fill(item, level + 1, shape, dt, out)


def _scalar(value: Any, dt: _DType) -> Any:  # type() is, not isinstance: a bool is not an int here
    """One JSON leaf value checked against the dtype (TF Serving's AddValueToTensor)."""
    kind = type(value)
    if dt.family == "float":
        if kind is int and abs(value) > dt.exact_int:
            raise _lossy(value, dt)
        if kind is float and math.isfinite(value) and abs(value) > dt.hi:
            raise _lossy(value, dt)
        if kind in (int, float):
            return value
    elif dt.family == "int":
        if kind is int:
            if dt.lo <= value <= dt.hi:
                return value
            raise InvalidArgument(
                f"JSON Value: {value} Type: Number is not of expected type: {dt.tf_name} "
                f"(it must be an integer from {dt.lo} to {dt.hi})"
            )
    elif dt.family == "bool":
        if kind is bool:
            return value
    elif kind is str:
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(
                f"JSON Value: {render_value(value)} is not valid Unicode text; send binary values as "
                "{\"b64\": \"...\"}"
            ) from None
    elif kind is dict:
        return decode_b64(value)
    raise InvalidArgument(
        f"JSON Value: {render_value(value)} Type: {json_type(value)} is not of expected type: {dt.tf_name}"
    )


def _lossy(value: object, dt: _DType) -> InvalidArgument:
    return InvalidArgument(
        f"Cannot convert JSON value: {render_value(value)} to {dt.tf_name} without loss of precision."
    )


def decode_b64(value: object) -> bytes:
    """{"b64": "..."} → bytes (standard alphabet; padding and line breaks optional, as absl allows)."""
    if not is_b64(value):
        raise InvalidArgument(
            f"JSON Value: {render_value(value)} not formatted correctly for base64 data; binary values must "
            "be objects with a single \"b64\" key holding a base64 string"
        )
    text = "".join(value["b64"].split())
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as err:
        raise InvalidArgument(
            f"Unable to base64 decode {render_value(value)} ({err}); use standard base64 "
            "(A-Z a-z 0-9 + /, '=' padding)"
        ) from None


_ARRAY_KINDS = {"float": "fiu", "int": "iu", "bool": "b"}


def _from_ndarray(arr: np.ndarray, dt: _DType, name: str) -> np.ndarray:
    """A numpy array an input_handler passed in-process: cast as its JSON would be, same checks."""
    kinds = _ARRAY_KINDS.get(dt.family, "")
    if arr.dtype.kind not in kinds:
        raise InvalidArgument(
            f"Input {name} was given a numpy array of {arr.dtype}, which cannot be used as "
            f"{dt.tf_name}; pass a numeric array, or the values as JSON lists"
        )
    if arr.size and dt.family in ("float", "int") and arr.dtype != dt.np_type:
        # The JSON path refuses values the input's type cannot hold; so does this one.
        if dt.family == "float":
            limit = dt.exact_int if arr.dtype.kind in "iu" else dt.hi
            lo, hi = -limit, limit
        else:
            lo, hi = dt.lo, dt.hi
        finite = arr[np.isfinite(arr)] if arr.dtype.kind == "f" else arr
        if finite.size and not (lo <= finite.min() and finite.max() <= hi):
            raise InvalidArgument(
                f"Input {name}: values from {finite.min()} to {finite.max()} do not fit {dt.tf_name}"
            )
    return arr.astype(dt.np_type, copy=False)


def _from_flat(flat: list[object], shape: list[int], dt: _DType) -> np.ndarray:
    if dt.family == "string":
        arr = np.empty(len(flat), dtype=object)
        arr[:] = flat
        return arr.reshape(shape)
    return np.array(flat, dtype=dt.np_type).reshape(shape)


def _size(shape: list[int]) -> int:
    return math.prod(shape)


def _shape_str(shape: list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _status_name(err: ServingError) -> str:
    """TF's Status::ToString prefix for a code ("Invalid argument", "Unimplemented", ...)."""
    return err.code.name.replace("_", " ").capitalize()


# -- classify / regress requests ---------------------------------------------------------------


def decode_classify_regress_request(doc: object, method: str = "classify") -> ExampleRequest:
    """A parsed `:classify` / `:regress` body → its examples and context (values checked later)."""
    if not isinstance(doc, dict):
        raise _format_error(doc, "Is not object; the request body must be a JSON object")
    signature_name = _signature_name(doc)
    context = doc.get("context")
    if "context" in doc and not isinstance(context, dict):
        raise InvalidArgument(
            f"Example must be JSON object but got JSON {json_type(context)} in 'context'; send the "
            "context as an object of feature name → value(s)"
        )
    if "examples" not in doc:
        raise _format_error(doc, f"When method is {method}, key 'examples' is expected and was not found")
    examples = doc["examples"]
    if not isinstance(examples, list):
        raise _format_error(doc, "Expecting 'examples' value to be an list/array")
    if not examples:
        raise _format_error(doc, "'examples' value is an empty array; send at least one example")
    for i, example in enumerate(examples):
        if not isinstance(example, dict):
            raise InvalidArgument(
                f"Example must be JSON object but got JSON {json_type(example)} at element {i} of "
                "'examples'; send each example as an object of feature name → value(s)"
            )
    return ExampleRequest(signature_name, examples, context)


# -- responses ---------------------------------------------------------------------------------


def error_body(message: str) -> bytes:
    """TF Serving's error answer: { "error": "<message>" } (kept valid JSON, unlike its CEscape)."""
    return b'{ "error": ' + orjson.dumps(message) + b" }"


class _B64:
    """Marks a string output value to be written as {"b64": "..."}."""

    __slots__ = ("text",)

    def __init__(self, data: bytes) -> None:
        self.text = base64.b64encode(data).decode("ascii")


class _Writer:
    """rapidjson's PrettyWriter (4-space indent, kFormatSingleLineArray), for byte-identical layout."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.stack: list[list[Any]] = []  # [in_array, value_count] per open container
        self.single_line = False

    def _prefix(self) -> None:
        if not self.stack:
            return
        level = self.stack[-1]
        out = self.parts
        if level[0]:
            if level[1]:
                out.append(b", " if self.single_line else b",")
            if not self.single_line:
                out.append(b"\n" + b"    " * len(self.stack))
        else:
            if level[1]:
                out.append(b",\n" if level[1] % 2 == 0 else b": ")
            else:
                out.append(b"\n")
            if level[1] % 2 == 0:
                out.append(b"    " * len(self.stack))
        level[1] += 1

    def raw(self, token: bytes) -> None:
        self._prefix()
        self.parts.append(token)

    def key(self, name: str) -> None:
        self.raw(orjson.dumps(name))

    def value(self, token: bytes | _B64) -> None:
        if isinstance(token, _B64):
            self.start_object()
            self.key("b64")
            self.raw(orjson.dumps(token.text))
            self.end_object()
        else:
            self.raw(token)

    def start_object(self) -> None:
        self._prefix()
        self.parts.append(b"{")
        self.stack.append([False, 0])

    def end_object(self) -> None:
        if self.stack.pop()[1]:
            self.parts.append(b"\n" + b"    " * len(self.stack))
        self.parts.append(b"}")

    def start_array(self) -> None:
        self._prefix()
        self.parts.append(b"[")
        self.stack.append([True, 0])

    def end_array(self) -> None:
        if self.stack.pop()[1] and not self.single_line:
            self.parts.append(b"\n" + b"    " * len(self.stack))
        self.parts.append(b"]")

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


class _Output:
    """One output tensor ready to write: numeric ones in orjson chunks, strings per element."""

    def __init__(self, name: str, array: object) -> None:
        arr = np.asarray(array)
        if arr.dtype.kind in "SU":
            arr = arr.astype(object)
        elif arr.dtype.kind in "biuf":
            if not arr.dtype.isnative:
                arr = arr.astype(arr.dtype.newbyteorder("="))
            if not arr.flags.c_contiguous:  # orjson only writes C-contiguous arrays
                arr = arr.copy(order="C")
        elif arr.dtype.kind != "O":
            raise InvalidArgument(
                f"Failed to write JSON value for output {name}: tensors of type {arr.dtype} cannot be "
                "represented in JSON; use the gRPC API for this signature"
            )
        self.name = name
        self.array = arr
        self.numeric = arr.dtype.kind != "O"
        self.as_bytes = name.endswith("_bytes")

    def token(self, item: object) -> bytes | _B64:
        """The JSON token of one string element: text, or {"b64": ...} for bytes."""
        if isinstance(item, str):
            item = item.encode("utf-8", "surrogatepass")
        if not isinstance(item, (bytes, bytearray, memoryview)):
            raise InvalidArgument(
                f"Failed to write JSON value for output {self.name}: expected bytes in a string "
                f"tensor, got {type(item).__name__}"
            )
        data = bytes(item)
        if self.as_bytes:
            return _B64(data)
        try:
            return orjson.dumps(data.decode("utf-8"))
        except UnicodeDecodeError:
            return _B64(data)  # not text: the only way to keep the JSON valid


def _dump(arr: np.ndarray, *, single_line: bool, depth: int) -> bytes:
    """A numeric array (or 0-d array) as JSON text laid out as rapidjson would at `depth`."""
    value: Any = arr[()] if arr.ndim == 0 else arr
    if single_line or arr.ndim == 0:
        text = orjson.dumps(value, option=_NUMPY).replace(b",", b", ")
    else:
        text = orjson.dumps(value, option=_NUMPY_INDENT)
        # orjson indents by 2 from column 0; rapidjson by 4 from the enclosing level.
        text = text.replace(b"  ", b"    ").replace(b"\n", b"\n" + b"    " * depth)
    if arr.dtype.kind == "f" and b"null" in text:
        # orjson writes NaN/Infinity as null; TF Serving writes them as bare NaN/Infinity tokens.
        bad = iter(arr[~np.isfinite(arr)].tolist() if arr.ndim else [float(value)])
        text = _NULL.sub(lambda _: _nonfinite_token(next(bad)), text)
    return text


def _nonfinite_token(value: float) -> bytes:
    if math.isnan(value):
        return b"NaN"
    return b"Infinity" if value > 0 else b"-Infinity"


def _write_tensor(w: _Writer, arr: np.ndarray, out: _Output) -> None:
    """AddTensorValues: nested arrays of the tensor's elements."""
    if out.numeric:
        w.raw(_dump(arr, single_line=w.single_line, depth=len(w.stack)))
    elif arr.ndim == 0:
        w.value(out.token(arr[()]))
    else:
        w.start_array()
        if arr.ndim == 1:
            for item in arr:
                w.value(out.token(item))
        else:
            for sub in arr:
                _write_tensor(w, sub, out)
        w.end_array()


def _outputs(outputs: Mapping[str, object]) -> list[_Output]:
    if not outputs:
        raise InvalidArgument("Cannot convert empty tensor map to JSON")
    return [_Output(name, outputs[name]) for name in sorted(outputs)]


def encode_predict_response(outputs: Mapping[str, object], row_format: bool) -> bytes:
    """Output arrays → TF Serving's `:predict` answer: {"predictions": rows} or {"outputs": value}."""
    tensors = _outputs(outputs)
    try:
        return _encode_rows(tensors) if row_format else _encode_columns(tensors)
    except orjson.JSONEncodeError as err:
        raise InvalidArgument(f"Failed to write JSON value: {err}") from None


_PREDICTIONS = b'{\n    "predictions": '


def _encode_rows(tensors: list[_Output]) -> bytes:
    batch = -1
    for t in tensors:
        if t.array.ndim == 0:
            raise InvalidArgument(
                f"Tensor name: {t.name} has no shape information; a scalar output cannot be split into "
                "rows, send the request in columnar format ({\"inputs\": ...}) instead"
            )
        if batch >= 0 and t.array.shape[0] != batch:
            raise InvalidArgument(
                f"Tensor name: {t.name} has inconsistent batch size: {t.array.shape[0]} expecting: {batch}; "
                "outputs of different batch sizes can only be returned in columnar format "
                "({\"inputs\": ...})"
            )
        batch = t.array.shape[0]
    only = tensors[0] if len(tensors) == 1 else None
    if only is not None and only.numeric and batch > 0:
        # One numeric output: the whole array in one chunk, then rapidjson's closing line, as
        # _Writer lays it out (written directly: this is every such answer's path).
        return _PREDICTIONS + _dump(only.array, single_line=True, depth=0)[:-1] + b"\n    ]\n}"
    w = _Writer()
    w.start_object()
    w.key("predictions")
    w.start_array()
    for item in range(batch):
        if only is None:
            w.start_object()
        w.single_line = True
        for t in tensors:
            if only is None:
                w.key(t.name)
            _write_tensor(w, t.array[item : item + 1].reshape(t.array.shape[1:]), t)
        w.single_line = False
        if only is None:
            w.end_object()
    w.end_array()
    w.end_object()
    return w.getvalue()


def _encode_columns(tensors: list[_Output]) -> bytes:
    w = _Writer()
    w.start_object()
    w.key("outputs")
    several = len(tensors) > 1
    if several:
        w.start_object()
    for t in tensors:
        if several:
            w.key(t.name)
        _write_tensor(w, t.array, t)
    if several:
        w.end_object()
    w.end_object()
    return w.getvalue()


def _float32_token(value: float) -> bytes:
    if not math.isfinite(value):
        return _nonfinite_token(value)
    return orjson.dumps(np.float32(value), option=_NUMPY)


def encode_classify_response(results: list[list[tuple[str, float]]]) -> bytes:
    """Classification results → {"results": [[[label, score], ...], ...]} as TF Serving lays it out."""
    if not results:
        raise InvalidArgument("Cannot convert empty ClassificationResults to JSON")
    w = _Writer()
    w.start_object()
    w.key("results")
    w.start_array()
    for classes in results:
        w.single_line = True
        w.start_array()
        for label, score in classes:
            w.start_array()
            w.raw(orjson.dumps(label))
            w.raw(_float32_token(score))
            w.end_array()
        w.end_array()
        w.single_line = False
    w.end_array()
    w.end_object()
    return w.getvalue()


def encode_regress_response(results: list[float]) -> bytes:
    """Regression results → {"results": [value, ...]} as TF Serving lays it out."""
    if not results:
        raise InvalidArgument("Cannot convert empty RegressionResults to JSON")
    w = _Writer()
    w.start_object()
    w.key("results")
    w.single_line = True
    w.start_array()
    for value in results:
        w.raw(_float32_token(value))
    w.end_array()
    w.end_object()
    return w.getvalue()


def encode_answer(answer: Answer) -> bytes:
    """Any answer in TF Serving's REST JSON: predictions/outputs, or classify/regress results."""
    if isinstance(answer, Prediction):
        return encode_predict_response(answer.outputs, answer.row_format)
    if isinstance(answer, Classification):
        return encode_classify_response(answer.results)
    return encode_regress_response(answer.results)
