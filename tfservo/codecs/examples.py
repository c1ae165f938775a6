"""JSON examples (+ shared context) → serialized tf.train.Example, by TF Serving's JSON rules.

The protobuf wire format is written directly: the three Example messages are tiny, and importing
TF's example_pb2 would load all of TensorFlow just to build them.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

from tfservo.codecs.tfs_json import decode_b64, is_b64, json_type, render_value
from tfservo.codecs.wire import field, varint
from tfservo.core.errors import InvalidArgument, ServingError

__all__ = ["build_examples"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FLOAT_MAX = 3.4028234663852886e38
_FLOAT_EXACT_INT = 2**24 - 1
_UINT64_MASK = 2**64 - 1

# Field tags (field number << 3 | wire type 2, length-delimited) of the Example protos.
_EXAMPLE_FEATURES = b"\x0a"  # Example.features
_FEATURES_ENTRY = b"\x0a"  # Features.feature (map entry)
_ENTRY_KEY, _ENTRY_VALUE = b"\x0a", b"\x12"
_KIND_TAG = {"bytes": b"\x0a", "float": b"\x12", "int64": b"\x1a"}  # Feature.kind oneof
_LIST_VALUE = b"\x0a"  # BytesList/FloatList/Int64List.value (packed for numbers)


def build_examples(
    examples: list[Any], context: Mapping[str, Any] | None, feature_types: Mapping[str, str] | None = None
) -> list[bytes]:
    """One serialized tf.train.Example per JSON example, the context's features merged in.

    A feature of the example replaces the context's feature of the same name. `feature_types`
    (feature → "float" | "int64" | "bytes", read from the model) lets JSON integers feed float
    features; without it a JSON integer is an int64 value, as in TF Serving.
    """
    types = feature_types or {}
    prefix = b""
    if context is not None:
        prefix = _example(context, "'context' object", types)
    # Like TF Serving: context bytes then example bytes. Parsing concatenated messages merges
    # them, and for the feature map the later (example's) entry wins.
    return [prefix + _example(ex, f"element: {i} of 'examples' list", types) for i, ex in enumerate(examples)]


def _example(value: object, where: str, types: Mapping[str, str]) -> bytes:
    try:
        if not isinstance(value, dict):
            raise InvalidArgument(
                f"Example must be JSON object but got JSON {json_type(value)}; send an object of "
                "feature name → value or list of values"
            )
        entries = b"".join(_entry(name, content, types.get(name)) for name, content in value.items())
    except ServingError as err:
        raise InvalidArgument(f"Failed to process {where}. Error: {err.message}") from None
    return field(_EXAMPLE_FEATURES, entries) if entries else b""


def _entry(name: str, content: object, declared: str | None) -> bytes:
    try:
        key = name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"Feature name {render_value(name)} is not valid Unicode text") from None
    feature = _feature(name, content if isinstance(content, list) else [content], declared)
    return field(_FEATURES_ENTRY, field(_ENTRY_KEY, key) + field(_ENTRY_VALUE, feature))


def _feature(name: str, values: list[object], declared: str | None) -> bytes:
    """A serialized Feature; all values must be of one kind (TF Serving's AddValueToFeature)."""
    kind: str | None = None
    items: list[Any] = []
    for value in values:
        value_kind, item = _feature_value(name, value, declared)
        if kind is None:
            kind = value_kind
        elif value_kind != kind:
            raise InvalidArgument(
                f"Unexpected element type in feature: {name} expecting type: {kind}; all values of a "
                "feature must be of one type (all integers, all decimals, or all strings)"
            )
        items.append(item)
    if kind is None:
        return b""  # an empty list: a Feature with no kind, as TF Serving sends it
    if kind == "bytes":
        body = b"".join(field(_LIST_VALUE, item) for item in items)
    elif kind == "float":
        body = field(_LIST_VALUE, struct.pack(f"<{len(items)}f", *items))
    else:
        body = field(_LIST_VALUE, b"".join(varint(item & _UINT64_MASK) for item in items))
    return field(_KIND_TAG[kind], body)


def _feature_value(name: str, value: Any, declared: str | None) -> tuple[str, Any]:
    """(kind, value) of one JSON value of a feature."""
    kind = type(value)
    if kind is bool and declared != "float":
        return "int64", int(value)
    if kind in (int, bool):
        if declared == "float":
            if abs(value) > _FLOAT_EXACT_INT:
                raise InvalidArgument(
                    f"Cannot convert JSON value: {value} to float without loss of precision "
                    f"(feature {name} is a float feature)."
                )
            return "float", float(value)
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise InvalidArgument(
                f"Feature: {name} has uint64 element. Only int64 is supported (got {value})."
            )
        return "int64", value
    if kind is float:
        if math.isfinite(value) and abs(value) > _FLOAT_MAX:
            raise InvalidArgument(
                f"Cannot convert JSON value: {render_value(value)} to float without loss of precision."
            )
        return "float", value
    if kind is str:
        try:
            return "bytes", value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(
                f"Feature: {name} has a value that is not valid Unicode text; send binary values as "
                "{\"b64\": \"...\"}"
            ) from None
    if is_b64(value):
        return "bytes", decode_b64(value)
    raise InvalidArgument(
        f"Feature: {name} has element with unexpected JSON type: {json_type(value)}; feature values "
        "are numbers, strings, booleans, {\"b64\": \"...\"} objects, or a flat list of those"
    )
