"""Plain descriptions of a SavedModel's signatures, independent of TensorFlow objects."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "CLASSIFY_METHOD",
    "DEFAULT_SIGNATURE",
    "PREDICT_METHOD",
    "REGRESS_METHOD",
    "Runner",
    "signature_from_proto",
    "SignatureDef",
    "tensor_info_name",
    "TensorSpec",
]

PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
DEFAULT_SIGNATURE = "serving_default"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a signature.

    `dtype` is TF's enum name ("DT_FLOAT", "DT_STRING", ...); `shape` is None for unknown
    rank, else a tuple with -1 for unknown dimensions (as TF Serving reports them).
    """

    key: str
    tensor_name: str
    dtype: str
    shape: tuple[int, ...] | None


@dataclass(frozen=True)
class SignatureDef:
    """A signature: its method name and its named inputs and outputs."""

    name: str
    method_name: str
    inputs: dict[str, TensorSpec] = field(default_factory=dict)
    outputs: dict[str, TensorSpec] = field(default_factory=dict)


# How a signature is run (LoadedModel.run, and the batcher in front of it): signature name,
# named input arrays and the output keys wanted (None: all) → named output arrays.
Runner = Callable[[str, dict[str, np.ndarray], Sequence[str] | None], dict[str, Any]]


def signature_from_proto(name: str, proto: Any) -> SignatureDef:
    """A SignatureDef proto (from a MetaGraphDef or a metadata answer) as a SignatureDef."""
    from tensorflow.core.framework import types_pb2  # only when a proto is at hand

    def spec(key: str, info: Any) -> TensorSpec:
        return TensorSpec(key, tensor_info_name(info), types_pb2.DataType.Name(info.dtype), _shape_of(info))

    return SignatureDef(
        name=name,
        method_name=proto.method_name,
        inputs={k: spec(k, v) for k, v in sorted(proto.inputs.items())},
        outputs={k: spec(k, v) for k, v in sorted(proto.outputs.items())},
    )


def tensor_info_name(info: Any) -> str:
    """A TensorInfo's tensor name (sparse/composite ones have none TF Serving could feed)."""
    return str(info.name or info.coo_sparse.values_tensor_name)


def _shape_of(info: Any) -> tuple[int, ...] | None:
    # An absent tensor_shape means "not recorded" (half_plus_three's x), not a scalar.
    if not info.HasField("tensor_shape") or info.tensor_shape.unknown_rank:
        return None
    return tuple(int(d.size) for d in info.tensor_shape.dim)
