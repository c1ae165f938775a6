"""Numeric tensors read straight out of TF Serving JSON, without a Python object per number.

A predict body that is only numbers in dense arrays — `{"instances": [[...]]}` or
`{"inputs": [...] | {"name": [...], ...}}`, with an optional `"signature_name"` — is parsed by
simdjson (pysimdjson) and each array copied into numpy as one flat buffer. For a 224×224×3
image in JSON that is about 9 ms instead of 48 ms (orjson objects, then numpy from nested
lists; docs/decisions.md). Anything else — other keys, strings, NaN, ragged or mixed
nesting, duplicate keys — answers None, and the caller parses the body the general way,
which also gives the precise error message for malformed requests.

Density is checked without walking the arrays: the body's brackets and commas, with
everything else deleted, must read exactly as dense arrays of the shapes found along each
array's first elements.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["NumericTensor", "numeric_values", "parse_numeric_request"]

_MAX_RANK = 64  # numpy arrays have at most 64 dimensions (TensorShape allows 254)
_REQUEST_KEYS = ("instances", "inputs")
_STRUCTURE = b"[],{}"
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in _STRUCTURE)
_local = threading.local()


@dataclass(frozen=True, slots=True)
class NumericTensor:
    """A JSON array of numbers, as an array: int64 when every number was an integer literal,
    else float64. `as_json()` gives the Python value, for the general path's checks."""

    values: np.ndarray
    as_json: Callable[[], Any]

    def __len__(self) -> int:
        return int(self.values.shape[0])


def parse_numeric_request(body: bytes) -> dict[str, Any] | None:
    """The request object with its numeric arrays as NumericTensors, or None (see module doc)."""
    if b"\\" in body:  # escapes could hide structure characters in names
        return None
    return _with_parser(lambda parser: _read(parser, body))


def numeric_values(json_array: bytes) -> np.ndarray | None:
    """The numbers of a JSON array (nested arrays flattened) as int64 when all are integer
    literals, else float64; None when it is not one JSON array of numbers."""

    def read(parser: Any) -> np.ndarray | None:
        doc = parser.parse(json_array)
        if not hasattr(doc, "as_buffer"):
            return None
        values = _buffer(doc)
        del doc
        return values

    return _with_parser(read)


def _with_parser(read: Callable[[Any], Any]) -> Any:
    """`read(parser)` with this thread's simdjson parser; None when simdjson refuses the text."""
    try:
        import simdjson
    except ImportError:  # pragma: no cover - a pinned dependency; the general path still works
        return None
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = simdjson.Parser()
    try:
        return read(parser)
    except (ValueError, TypeError, RuntimeError, KeyError, IndexError):
        _local.parser = None  # a parse that failed midway may leave the parser unusable
        return None


def _read(parser: Any, body: bytes) -> dict[str, Any] | None:
    doc = parser.parse(body)
    if not hasattr(doc, "keys"):
        return None
    keys = list(doc.keys())
    if len(set(keys)) != len(keys) or sum(k in keys for k in _REQUEST_KEYS) != 1:
        return None
    out: dict[str, Any] = {}
    expected: list[bytes] = []
    for key in keys:
        if _has_structure(key):
            return None
        value = doc[key]
        if key == "signature_name":
            if not isinstance(value, str) or _has_structure(value):
                return None
            out[key] = value
            expected.append(b"")
        elif key in _REQUEST_KEYS:
            read = _read_value(value, body, key)
            if read is None:
                return None
            out[key], structure = read
            expected.append(structure)
        else:
            return None
    del doc, value  # release the parser's document before the next parse
    if body.translate(None, _NOT_STRUCTURE) != b"{" + b",".join(expected) + b"}":
        return None
    return out


def _read_value(value: Any, body: bytes, key: str) -> tuple[Any, bytes] | None:
    """(NumericTensor, its structure) for an array; a dict of them for {"name": array, ...}."""
    if hasattr(value, "as_buffer"):
        tensor = _tensor(value, lambda: _from_json(body)[key])
        return None if tensor is None else (tensor, _dense(tensor.values.shape))
    if not hasattr(value, "keys"):
        return None
    names = list(value.keys())
    if len(set(names)) != len(names):
        return None
    tensors: dict[str, NumericTensor] = {}
    parts: list[bytes] = []
    for name in names:
        if _has_structure(name):
            return None
        item = value[name]
        if not hasattr(item, "as_buffer"):
            return None
        tensor = _tensor(item, functools.partial(_item_json, body, key, name))
        if tensor is None:
            return None
        tensors[name] = tensor
        parts.append(_dense(tensor.values.shape))
    return tensors, b"{" + b",".join(parts) + b"}"


def _tensor(array: Any, as_json: Callable[[], Any]) -> NumericTensor | None:
    shape = []
    probe = array
    while hasattr(probe, "as_buffer"):
        shape.append(len(probe))
        if len(shape) > _MAX_RANK or not shape[-1]:
            return None
        probe = probe[0]
    if isinstance(probe, bool) or not isinstance(probe, (int, float)):
        return None
    values = _buffer(array)
    if values.size != int(np.prod(shape)):
        return None
    return NumericTensor(values.reshape(shape), as_json)


def _buffer(array: Any) -> np.ndarray:
    """A simdjson array's numbers, flattened: int64 if all are integer literals, else float64."""
    try:
        return np.frombuffer(array.as_buffer(of_type="i"), dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.frombuffer(array.as_buffer(of_type="d"), dtype=np.float64)


def _dense(shape: tuple[int, ...]) -> bytes:
    """The brackets and commas of a dense JSON array of `shape`."""
    inner = b""
    for size in reversed(shape):
        inner = b"[" + b",".join([inner] * size) + b"]"
    return inner


def _has_structure(text: str) -> bool:
    return any(c in text for c in "[],{}\"")


def _item_json(body: bytes, key: str, name: str) -> Any:
    return _from_json(body)[key][name]


def _from_json(body: bytes) -> Any:
    import orjson

    return orjson.loads(body)
