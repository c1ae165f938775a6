"""The data plane's typed values: what a caller asked the model for, and what it answered.

Every front door decodes its protocol into a Call once (REST JSON, SageMaker's content types,
gRPC protos, pipeline elements), `TFServingAPI.run` turns it into an Answer holding arrays,
and the arrays stay arrays until the one place that writes the caller's format (TF Serving
JSON, CSV, JSON lines, per-record transform output, TensorProto).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tfservo.core.errors import InvalidArgument
from tfservo.models.signatures import SignatureDef

__all__ = [
    "METHODS",
    "Answer",
    "Call",
    "Classification",
    "InferRequest",
    "InferResponse",
    "ExamplesCall",
    "PredictCall",
    "Prediction",
    "Regression",
    "answer_rows_slice",
    "parse_version",
]

METHODS = ("predict", "classify", "regress")


def parse_version(text: str | None) -> int | None:
    """A model version as a URL or a message gives it: None (or "", a proto's unset string) for
    the latest, else a number. The one parser of every door (TF Serving REST, V2 REST and gRPC)."""
    if text is None or text == "":
        return None
    if not text.isdigit():
        raise InvalidArgument(f"Model version must be a number, got {text!r}")
    return int(text)


@dataclass(frozen=True, slots=True)
class PredictCall:
    """Run one signature on named input arrays."""

    signature_name: str
    inputs: dict[str, np.ndarray]
    row_format: bool = True  # answer in rows ({"predictions": ...}) or columns ({"outputs": ...})
    output_keys: tuple[str, ...] | None = None  # None: every output
    signature: SignatureDef | None = None  # when the decoder already looked it up


@dataclass(frozen=True, slots=True)
class ExamplesCall:
    """Classify or regress serialized tf.train.Examples with one signature."""

    method: str  # "classify" | "regress"
    signature_name: str
    examples: Sequence[bytes]


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predict answer: output arrays, batch first, from one model version."""

    model_name: str
    version: int
    signature_name: str
    outputs: dict[str, np.ndarray]
    row_format: bool = True


@dataclass(frozen=True, slots=True)
class Classification:
    """A classify answer: per example its (label, score) pairs."""

    model_name: str
    version: int
    signature_name: str
    results: list[list[tuple[str, float]]]


@dataclass(frozen=True, slots=True)
class Regression:
    """A regress answer: one value per example."""

    model_name: str
    version: int
    signature_name: str
    results: list[float]


Call = PredictCall | ExamplesCall
Answer = Prediction | Classification | Regression


def answer_rows_slice(answer: Answer, start: int, stop: int, total: int) -> Answer | None:
    """Records start..stop of an answer to `total` records, as the answer to just those;
    None when the answer is not one row per record (a columnar or odd-shaped prediction)."""
    if isinstance(answer, Prediction):
        outputs = answer.outputs
        if not answer.row_format or any(np.ndim(v) == 0 or np.shape(v)[0] != total for v in outputs.values()):
            return None
        rows = {k: v[start:stop] for k, v in outputs.items()}
        return Prediction(answer.model_name, answer.version, answer.signature_name, rows, True)
    if len(answer.results) != total:
        return None
    if isinstance(answer, Classification):
        return Classification(answer.model_name, answer.version, answer.signature_name, answer.results[start:stop])
    return Regression(answer.model_name, answer.version, answer.signature_name, answer.results[start:stop])


@dataclass
class InferRequest:
    """A decoded V2 inference request."""

    model: str
    version: int | None
    inputs: dict[str, np.ndarray]
    id: str | None = None
    parameters: dict[str, object] = field(default_factory=dict)
    outputs: list[str] | None = None  # names asked for; None: all
    output_parameters: dict[str, dict[str, object]] = field(default_factory=dict)


@dataclass
class InferResponse:
    """A V2 inference answer: output arrays of one model version."""

    model: str
    version: int
    id: str | None
    outputs: dict[str, np.ndarray]
