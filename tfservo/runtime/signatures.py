"""Plain descriptions of a SavedModel's signatures, independent of TensorFlow objects."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
