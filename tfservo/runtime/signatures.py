"""Plain descriptions of a SavedModel's signatures, independent of TensorFlow objects."""

from __future__ import annotations

from dataclasses import dataclass, field

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
