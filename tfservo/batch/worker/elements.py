"""Beam elements → one batch of signature inputs, and batch outputs → one result per element.

Predict elements are a signature input's value (array, scalar, nested list, bytes, or a
tf.train.Example for a one-string-input signature) or a dict of input name → value; they are
stacked along a new axis 0. Classify/regress elements are tf.train.Examples, their serialized
bytes, or a dict of feature → value(s) built into an Example by TF Serving's JSON rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfservo.codecs.examples import build_examples
from tfservo.core.errors import InvalidArgument
from tfservo.models.signatures import SignatureDef

__all__ = ["serialize_examples", "split_outputs", "stack_inputs"]


def stack_inputs(batch: Sequence[Any], signature: SignatureDef) -> dict[str, np.ndarray]:
    """The batch as the signature's input arrays, element i at index i of axis 0."""
    names = sorted(signature.inputs)
    if isinstance(batch[0], Mapping):
        keys = sorted(batch[0])
        for i, element in enumerate(batch):
            if not isinstance(element, Mapping) or sorted(element) != keys:
                got = sorted(element) if isinstance(element, Mapping) else type(element).__name__
                raise InvalidArgument(
                    f"element {i} has inputs {got} but element 0 has {keys}; every element of a "
                    f"batch must name the same inputs (signature {signature.name}: {', '.join(names)})"
                )
        columns = {key: [element[key] for element in batch] for key in keys}
    else:
        if len(names) != 1:
            raise InvalidArgument(
                f"signature {signature.name} has inputs {', '.join(names)}; give each element as "
                f"a dict of input name → value, not a {type(batch[0]).__name__}"
            )
        for i, element in enumerate(batch):
            if isinstance(element, Mapping):
                raise InvalidArgument(
                    f"element {i} is a dict but element 0 is a {type(batch[0]).__name__}; every "
                    "element of a batch must have the same form"
                )
        columns = {names[0]: list(batch)}
    return {key: _stack(key, values, signature) for key, values in columns.items()}


def _stack(key: str, values: list[Any], signature: SignatureDef) -> np.ndarray:
    spec = signature.inputs.get(key)
    strings = spec is not None and spec.dtype == "DT_STRING"
    if strings:
        values = [v.SerializeToString() if _is_example(v) else v for v in values]
        if all(isinstance(v, bytes) for v in values):  # the common case: one string per element
            out = np.empty(len(values), dtype=object)
            out[:] = values
            return out
    arrays = [_as_array(value, strings) for value in values]
    shape = arrays[0].shape
    for i, arr in enumerate(arrays):
        if arr.shape != shape:
            raise InvalidArgument(
                f"input '{key}' of element {i} has shape {list(arr.shape)} but element 0 has "
                f"{list(shape)}; elements batched together must have one shape (pad them, or "
                "use max_batch_size=1)"
            )
    if strings or any(arr.dtype == object for arr in arrays):
        out = np.empty((len(arrays), *shape), dtype=object)
        for i, arr in enumerate(arrays):
            out[i, ...] = arr  # `out[i] = arr` would store a 0-d array object, not its bytes
        return out
    return np.stack(arrays)


def _as_array(value: Any, strings: bool) -> np.ndarray:
    """One element's value as an array; bytes stay whole (numpy's 'S' dtype drops trailing NULs)."""
    if _is_example(value):
        value = value.SerializeToString()
    if isinstance(value, np.ndarray):
        return value.astype(object) if value.dtype.kind == "S" else value
    if hasattr(value, "numpy") and callable(value.numpy):  # a tf.Tensor
        return _as_array(value.numpy(), strings)
    if isinstance(value, (bytes, str)):
        arr = np.empty((), dtype=object)
        arr[()] = value
        return arr
    return np.array(value, dtype=object) if strings else np.asarray(value)


def serialize_examples(batch: Sequence[Any], feature_types: Mapping[str, str]) -> list[bytes]:
    """The batch as serialized tf.train.Examples (Examples, bytes, or feature dicts)."""
    out: list[bytes] = []
    for i, element in enumerate(batch):
        if isinstance(element, bytes):
            out.append(element)
        elif _is_example(element):
            out.append(element.SerializeToString())
        elif isinstance(element, Mapping):
            try:
                out.extend(build_examples([dict(element)], None, feature_types))
            except InvalidArgument as exc:
                raise InvalidArgument(f"element {i}: {exc.message}") from None
        else:
            raise InvalidArgument(
                f"element {i} is a {type(element).__name__}; classify and regress take a "
                "tf.train.Example, its serialized bytes, or a dict of feature name → value(s)"
            )
    return out


def split_outputs(
    outputs: Mapping[str, np.ndarray], batch_size: int, where: str
) -> list[dict[str, np.ndarray]]:
    """Batch outputs → one dict of output name → row per element."""
    for key, arr in outputs.items():
        if arr.ndim == 0 or arr.shape[0] != batch_size:
            raise InvalidArgument(
                f"output '{key}' of {where} has shape {list(arr.shape)}, so it cannot be split into "
                f"{batch_size} elements along axis 0; this signature does not batch: use "
                "max_batch_size=1"
            )
    return [{key: arr[i] for key, arr in outputs.items()} for i in range(batch_size)]


def _is_example(value: object) -> bool:
    return type(value).__name__ in ("Example", "SequenceExample") and hasattr(value, "SerializeToString")
