"""Numeric tensors read straight out of TF Serving JSON, without a Python object per number.

A predict body that is only numbers in dense arrays — `{"instances": [[...]]}` or
`{"inputs": [...] | {"name": [...], ...}}`, with an optional `"signature_name"` — is parsed by
simdjson (pysimdjson) and each array copied into numpy as one flat buffer. For a 224×224×3
image in JSON that is about 9 ms instead of 48 ms (orjson objects, then numpy from nested
lists; docs/decisions.md). Anything else — other keys, strings, NaN, ragged or mixed
nesting, duplicate keys — answers None, and the caller parses the body the general way,
which also gives the precise error message for malformed requests.

Density is checked without walking the numbers. Arrays of rank 1 or 2 (the usual request) need
their rows to be arrays of the first row's length and the body to hold exactly the "[" those
shapes have: one more anywhere means an array nested where a number belongs. Higher ranks can
hide ragged rows behind equal counts, so for them the body's brackets and commas, with
everything else deleted, must read exactly as dense arrays of the shapes found along each
array's first elements (that deletion walks every byte: 8 µs of a 15 KB body's 25).

Large bodies with one array (`{"instances": [...]}`, the usual big request) are read with
bounded memory: the shape comes from that bracket skeleton, and the numbers are parsed a
megabyte at a time into one preallocated array, so decoding costs the array itself rather
than simdjson's document (2.3x the body: its own padded copy plus its tape).
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

__all__ = ["BOUNDED_FROM_BYTES", "NumericTensor", "csv_numbers", "parse_numeric_request"]

_T = TypeVar("_T")

BOUNDED_FROM_BYTES = 4 << 20  # bodies at least this big are read a chunk at a time
_CHUNK_BYTES = 1 << 20
_BRACKETS_TO_SPACES = bytes.maketrans(b"[]", b"  ")

_MAX_RANK = 64  # numpy arrays have at most 64 dimensions (TensorShape allows 254)
_REQUEST_KEYS = ("instances", "inputs")
_STRUCTURE = b"[],{}"
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in _STRUCTURE)
_STRUCTURE_CHARS = re.compile(r'[\[\],{}"]')  # what a key or name must not hold
_ROW_CHECK_BYTES = 256  # a row's check (~0.1 µs) costs what deleting ~230 body bytes does
_RAGGED = -1  # _brackets: a row is not an array of the first row's length
_local = threading.local()


@dataclass(frozen=True, slots=True)
class NumericTensor:
    """A JSON array of numbers, as an array: int64 when every number was an integer literal,
    else float64. `as_json()` gives the Python value, for the general path's checks."""

    values: np.ndarray
    as_json: Callable[[], Any]

    def __len__(self) -> int:
        return int(self.values.shape[0])


def parse_numeric_request(
    body: bytes, *, bounded_from: int = BOUNDED_FROM_BYTES, chunk_bytes: int = _CHUNK_BYTES
) -> dict[str, object] | None:
    """The request object with its numeric arrays as NumericTensors, or None (see module doc).
    Bodies of `bounded_from` bytes or more are read `chunk_bytes` at a time where they can be."""
    if b"\\" in body:  # escapes could hide structure characters in names
        return None
    if len(body) >= bounded_from:
        doc = _with_parser(lambda parser: _read_one_array(parser, body, chunk_bytes))
        if doc is not None:
            return doc
    return _with_parser(lambda parser: _read(parser, body))


def csv_numbers(data: bytes, rows: int, fields: int, *, chunk_bytes: int = _CHUNK_BYTES) -> np.ndarray | None:
    """The rows×fields numbers of CSV text whose every line holds `fields` comma-separated JSON
    numbers, flat, read `chunk_bytes` of lines at a time: int64 when all are integer literals,
    else float64. None when a line has another count of fields or anything but numbers."""

    def pieces() -> Iterator[bytes | None]:
        pos = 0
        while pos < len(data):
            stop = min(len(data), pos + chunk_bytes)
            if stop < len(data):
                stop = data.find(b"\n", stop)
                stop = len(data) if stop < 0 else stop
            piece = data[pos:stop]
            yield b"[" + piece.replace(b"\n", b",") + b"]" if _same_field_counts(piece, fields) else None
            pos = stop + 1

    return _with_parser(lambda parser: _fill_numbers(parser, pieces(), rows * fields))


def _same_field_counts(lines: bytes, fields: int) -> bool:
    """Every line of `lines` has `fields` comma-separated fields."""
    if lines.count(b",") != (lines.count(b"\n") + 1) * (fields - 1):
        return False
    if fields == 1:
        return True
    buf = np.frombuffer(lines, dtype=np.uint8)
    commas = np.cumsum(buf == ord(","), dtype=np.int64)
    ends = np.append(np.flatnonzero(buf == ord("\n")), buf.size - 1)
    return bool(np.all(np.diff(commas[ends], prepend=0) == fields - 1))


def _with_parser(read: Callable[[object], _T]) -> _T | None:
    """`read(parser)` with this thread's simdjson parser; None when simdjson refuses the text."""
    parser = getattr(_local, "parser", None)
    if parser is None:
        try:
            import simdjson
        except ImportError:  # pragma: no cover - a pinned dependency; the general path still works
            return None
        parser = _local.parser = simdjson.Parser()
    try:
        return read(parser)
    except (ValueError, TypeError, RuntimeError, KeyError, IndexError):
        _local.parser = None  # a parse that failed midway may leave the parser unusable
        return None


def _read_one_array(parser: object, body: bytes, chunk_bytes: int) -> dict[str, object] | None:
    """A body that is one numeric array under "instances" or "inputs" (and at most a
    "signature_name"), read without a document of the whole body; None for anything else."""
    first, last = body.find(b"["), body.rfind(b"]")
    if first < 0 or last < first:
        return None
    prefix, suffix = body[:first], body[last + 1 :]
    outer = _outer_object(prefix, suffix)
    if outer is None:
        return None
    skeleton = body.translate(None, _NOT_STRUCTURE)
    inner = skeleton[len(prefix.translate(None, _NOT_STRUCTURE)) : len(skeleton) - len(suffix.translate(None, _NOT_STRUCTURE))]
    shape = _skeleton_shape(inner)
    if shape is None:
        return None
    del skeleton, inner
    values = _chunked_numbers(parser, body, first, last + 1, int(np.prod(shape)), chunk_bytes)
    if values is None:
        return None
    key = next(k for k in _REQUEST_KEYS if k in outer)
    return {**outer, key: NumericTensor(values.reshape(shape), lambda: _from_json(body)[key])}


def _outer_object(prefix: bytes, suffix: bytes) -> dict[str, object] | None:
    """The object around the array, the array replaced by 0: one request key and at most a
    plain "signature_name"; None otherwise."""
    import orjson

    around = prefix + suffix
    try:
        outer = orjson.loads(prefix + b"0" + suffix)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(outer, dict) or not set(outer) <= {*_REQUEST_KEYS, "signature_name"}:
        return None
    keys = [k for k in _REQUEST_KEYS if k in outer]
    if len(keys) != 1 or outer[keys[0]] != 0 or around.count(f'"{keys[0]}"'.encode()) != 1:
        return None
    name = outer.get("signature_name", "")
    if not isinstance(name, str) or _has_structure(name) or around.count(b'"signature_name"') > 1:
        return None
    return outer


def _skeleton_shape(skeleton: bytes) -> tuple[int, ...] | None:
    """The shape of the dense array whose brackets and commas are `skeleton`, or None. (A
    skeleton cannot tell [] from [x]: the count of numbers read settles that.)"""
    rank = len(skeleton) - len(skeleton.lstrip(b"["))
    if not 0 < rank <= _MAX_RANK:
        return None
    close = skeleton.find(b"]")
    sizes = [skeleton.count(b",", rank, close) + 1]
    unit = skeleton[rank - 1 : close + 1]
    for start in range(rank - 2, -1, -1):  # each enclosing level's first array
        pos, count = start + 1, 1
        while skeleton.startswith(unit + b",", pos):
            pos += len(unit) + 1
            count += 1
        if not skeleton.startswith(unit + b"]", pos):
            return None
        sizes.append(count)
        unit = skeleton[start : pos + len(unit) + 1]
    shape = tuple(reversed(sizes))
    return shape if skeleton == _dense(shape) else None


def _chunked_numbers(parser: object, body: bytes, start: int, end: int, count: int, chunk_bytes: int) -> np.ndarray | None:
    """The `count` numbers in body[start:end], brackets ignored, parsed `chunk_bytes` at a time
    (cut at commas); see _fill_numbers."""

    def pieces() -> Iterator[bytes]:
        pos = start
        while pos < end:
            stop = min(end, pos + chunk_bytes)
            if stop < end:
                stop = body.find(b",", stop, end)
                stop = end if stop < 0 else stop
            yield b"[" + body[pos:stop].translate(_BRACKETS_TO_SPACES) + b"]"
            pos = stop + 1

    return _fill_numbers(parser, pieces(), count)


def _fill_numbers(parser: Any, pieces: Iterable[bytes | None], count: int) -> np.ndarray | None:
    """The numbers of JSON arrays of numbers `pieces`, `count` of them in all, in one array:
    int64 while every number is an integer literal, else float64. None when a piece is None,
    holds anything but numbers, or the count differs."""
    out = np.empty(count, dtype=np.int64)
    filled = 0
    for piece in pieces:
        if piece is None:
            return None
        doc = parser.parse(piece)
        if not hasattr(doc, "as_buffer"):
            return None
        if out.dtype == np.int64:
            try:
                part = np.frombuffer(doc.as_buffer(of_type="i"), dtype=np.int64)
            except (TypeError, ValueError, OverflowError):
                out = out.astype(np.float64)
        if out.dtype == np.float64:
            part = np.frombuffer(doc.as_buffer(of_type="d"), dtype=np.float64)
        del doc
        if filled + part.size > count:
            return None
        out[filled : filled + part.size] = part
        filled += part.size
    return out if filled == count else None


def _read(parser: Any, body: bytes) -> dict[str, Any] | None:
    doc = parser.parse(body)
    if not hasattr(doc, "keys"):
        return None
    keys = list(doc.keys())
    if len(keys) == 1:  # the usual body: {"instances": ...} or {"inputs": ...}
        if keys[0] not in _REQUEST_KEYS:
            return None
    elif len(set(keys)) != len(keys) or sum(k in keys for k in _REQUEST_KEYS) != 1:
        return None
    out: dict[str, object] = {}
    layouts: list[_Layout] = []
    brackets: int | None = 0
    for key in keys:
        if _has_structure(key):
            return None
        value = doc[key]
        if key == "signature_name":
            if not isinstance(value, str) or _has_structure(value):
                return None
            out[key] = value
            layouts.append(())
        elif key in _REQUEST_KEYS:
            read = _read_value(value, body, key)
            if read is None:
                return None
            out[key], layout, held = read
            layouts.append(layout)
            brackets = _plus(brackets, held)
        else:
            return None
    del doc, value  # release the parser's document before the next parse
    if brackets is not None:  # rows checked: the count of brackets settles the rest
        return out if _occurs(body, b"[", brackets) else None
    if body.translate(None, _NOT_STRUCTURE) != b"{" + b",".join(map(_skeleton, layouts)) + b"}":
        return None
    return out


# What a request key holds: an array's shape, the shapes of {"name": array, ...}, or () for a
# plain string (signature_name); _skeleton gives its brackets and commas.
_Layout = tuple[int, ...] | list[tuple[int, ...]]


def _skeleton(layout: _Layout) -> bytes:
    if isinstance(layout, list):
        return b"{" + b",".join(map(_dense, layout)) + b"}"
    return _dense(layout) if layout else b""


def _plus(total: int | None, more: int | None) -> int | None:
    """A count of "[" so far plus one more value's; None once any value's is unknown."""
    return None if total is None or more is None else total + more


def _read_value(value: Any, body: bytes, key: str) -> tuple[Any, _Layout, int | None] | None:
    """(NumericTensor, its layout, its count of "[" once its rows are checked) for an array; a
    dict of them for {"name": array, ...}. The count is None where only the skeleton tells."""
    if hasattr(value, "as_buffer"):
        tensor = _tensor(value, lambda: _from_json(body)[key])
        if tensor is None:
            return None
        held = _brackets(value, tensor.values.shape, len(body))
        return None if held == _RAGGED else (tensor, tensor.values.shape, held)
    if not hasattr(value, "keys"):
        return None
    names = list(value.keys())
    if len(set(names)) != len(names):
        return None
    tensors: dict[str, NumericTensor] = {}
    total: int | None = 0
    for name in names:
        if _has_structure(name):
            return None
        item = value[name]
        if not hasattr(item, "as_buffer"):
            return None
        tensor = _tensor(item, functools.partial(_item_json, body, key, name))
        if tensor is None:
            return None
        held = _brackets(item, tensor.values.shape, len(body))
        if held == _RAGGED:
            return None
        total = _plus(total, held)
        tensors[name] = tensor
    return tensors, [t.values.shape for t in tensors.values()], total


def _brackets(array: Any, shape: tuple[int, ...], body_bytes: int) -> int | None:
    """The "[" a dense array of `shape` holds, once its rows are seen to be arrays of shape[1]
    numbers' worth (rank 1 or 2; _RAGGED if one is not). Then, with its numbers counted, the
    body's count of "[" settles density: an array nested anywhere else adds one. None for
    higher ranks, where equal counts can still hide ragged rows ([[[1,2],[3,4]],[[5,6,7],[8]]]),
    and for rows so many and short that checking each costs more than the skeleton."""
    if len(shape) == 1:
        return 1
    if len(shape) != 2 or shape[0] * _ROW_CHECK_BYTES > body_bytes:
        return None
    for row in array:
        if not hasattr(row, "as_buffer") or len(row) != shape[1]:
            return _RAGGED
    return 1 + shape[0]


def _occurs(data: bytes, char: bytes, times: int) -> bool:
    """Whether `char` occurs exactly `times` times in `data` (one memchr-backed find per
    occurrence; bytes.count walks every byte, ~4 µs for a 15 KB body)."""
    pos = -1
    for _ in range(times):
        pos = data.find(char, pos + 1)
        if pos < 0:
            return False
    return data.find(char, pos + 1) < 0


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
    values = _buffer(array, floats=isinstance(probe, float))
    if values.size != math.prod(shape):
        return None
    return NumericTensor(values.reshape(shape), as_json)


def _buffer(array: Any, *, floats: bool = False) -> np.ndarray:
    """A simdjson array's numbers, flattened: int64 if all are integer literals, else float64
    (at once when the caller saw a float among them)."""
    if floats:
        return np.frombuffer(array.as_buffer(of_type="d"), dtype=np.float64)
    try:
        return np.frombuffer(array.as_buffer(of_type="i"), dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.frombuffer(array.as_buffer(of_type="d"), dtype=np.float64)


def _dense(shape: tuple[int, ...]) -> bytes:
    """The brackets and commas of a dense JSON array of `shape`."""
    inner = b""
    for size in reversed(shape):
        inner = b"[" + (inner + b",") * (size - 1) + inner + b"]" if size else b"[]"
    return inner


def _has_structure(text: str) -> bool:
    return _STRUCTURE_CHARS.search(text) is not None


def _item_json(body: bytes, key: str, name: str) -> Any:
    return _from_json(body)[key][name]


def _from_json(body: bytes) -> Any:
    import orjson

    return orjson.loads(body)
