"""Classify/regress signature outputs → TF Serving's results (classifier.cc / regressor.cc rules,
with their current codes: a signature that does not fit is INVALID_ARGUMENT)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from tfservo.core.errors import InvalidArgument
from tfservo.models.signatures import CLASSIFY_METHOD, REGRESS_METHOD, SignatureDef

if TYPE_CHECKING:
    from tensorflow_serving.apis import classification_pb2, regression_pb2

__all__ = [
    "CLASSES",
    "INPUTS",
    "OUTPUTS",
    "SCORES",
    "check_classify_signature",
    "check_regress_signature",
    "classification_result_proto",
    "classification_results",
    "regression_result_proto",
    "regression_results",
]

# Signature keys fixed by TF Serving (tensorflow/cc/saved_model/signature_constants.h).
INPUTS = "inputs"
CLASSES = "classes"
SCORES = "scores"
OUTPUTS = "outputs"

_TF_DTYPE = {
    "float16": "DT_HALF",
    "float32": "DT_FLOAT",
    "float64": "DT_DOUBLE",
    "int8": "DT_INT8",
    "int16": "DT_INT16",
    "int32": "DT_INT32",
    "int64": "DT_INT64",
    "uint8": "DT_UINT8",
    "uint16": "DT_UINT16",
    "uint32": "DT_UINT32",
    "uint64": "DT_UINT64",
    "bool": "DT_BOOL",
    "object": "DT_STRING",
}


def _dtype_name(arr: np.ndarray) -> str:
    if arr.dtype.kind in "SU":
        return "DT_STRING"
    return _TF_DTYPE.get(arr.dtype.name, arr.dtype.name)


def _shape(arr: np.ndarray) -> str:
    return "[" + ",".join(str(d) for d in arr.shape) + "]"


def _describe(signature: SignatureDef) -> str:
    inputs = ", ".join(sorted(signature.inputs)) or "none"
    outputs = ", ".join(sorted(signature.outputs)) or "none"
    return f"signature {signature.name} (inputs: {inputs}; outputs: {outputs})"


def check_classify_signature(signature: SignatureDef, *, check_method_name: bool = False) -> None:
    """Refuse a signature TF Serving cannot classify with (PreProcessClassification); its
    method_name only with TF Serving's --enable_signature_method_name_check."""
    count = len(signature.outputs)
    wrong_outputs = None if count in (1, 2) else f"Expected one or two output Tensors, found {count}"
    _check_examples_signature(signature, CLASSIFY_METHOD, "classification", wrong_outputs, check_method_name)
    _check_classify_outputs(signature)


def check_regress_signature(signature: SignatureDef, *, check_method_name: bool = False) -> None:
    """Refuse a signature TF Serving cannot regress with (PreProcessRegression); its
    method_name only with TF Serving's --enable_signature_method_name_check."""
    wrong_outputs = None if len(signature.outputs) == 1 else "Expected one output Tensor"
    _check_examples_signature(signature, REGRESS_METHOD, "regression", wrong_outputs, check_method_name)
    _check_regress_outputs(signature)


def _check_examples_signature(
    signature: SignatureDef, method: str, kind: str, wrong_outputs: str | None, check_method_name: bool
) -> None:
    """What classify and regress both require, in TF Serving's order: the method, one input,
    the number of outputs (`wrong_outputs` says what is wrong with it), an input called "inputs"."""
    if check_method_name and signature.method_name != method:
        raise InvalidArgument(
            f"Expected {kind} signature method_name to be {method}. Was: {signature.method_name} "
            f"({_describe(signature)}); pick a {method.rsplit('/', 1)[-1]} signature with signature_name"
        )
    if len(signature.inputs) != 1:
        raise InvalidArgument(f"Expected one input Tensor in {_describe(signature)}.")
    if wrong_outputs is not None:
        raise InvalidArgument(f"{wrong_outputs} in {_describe(signature)}.")
    if INPUTS not in signature.inputs:
        raise InvalidArgument(f"No {kind} inputs found in SignatureDef: {_describe(signature)}")


def _check_classify_outputs(signature: SignatureDef) -> None:
    if CLASSES not in signature.outputs and SCORES not in signature.outputs:
        raise InvalidArgument(
            f'Expected classification signature outputs to contain at least one of "{CLASSES}" or '
            f'"{SCORES}". Signature was: {_describe(signature)}'
        )


def _check_regress_outputs(signature: SignatureDef) -> None:
    if OUTPUTS not in signature.outputs:
        raise InvalidArgument(f"No regression outputs found in SignatureDef: {_describe(signature)}")


def _output(outputs: Mapping[str, object], key: str, signature: SignatureDef) -> np.ndarray:
    if key not in outputs:
        raise InvalidArgument(
            f"Could not find output tensor '{key}' in the results of {_describe(signature)}"
        )
    return np.asarray(outputs[key])


def _check_matrix(arr: np.ndarray, key: str, want: str, batch: int) -> None:
    if arr.ndim != 2:
        raise InvalidArgument(
            f"Expected Tensor shape: [batch_size num_classes] but got {_shape(arr)} for output '{key}'"
        )
    if _dtype_name(arr) != want:
        raise InvalidArgument(f"Expected {key} Tensor of {want}. Got: {_dtype_name(arr)}")
    if arr.shape[0] != batch:
        raise InvalidArgument(f"Expected {key} output batch size of {batch}. Got: {arr.shape[0]}")


def _label(value: object) -> str:
    if isinstance(value, (bytes, bytearray, np.bytes_)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def classification_results(
    outputs: Mapping[str, object], signature: SignatureDef, batch: int
) -> list[list[tuple[str, float]]]:
    """Per example, its (label, score) pairs; label "" without a classes output, score 0.0 without scores."""
    _check_classify_outputs(signature)
    has_classes, has_scores = CLASSES in signature.outputs, SCORES in signature.outputs
    classes = _output(outputs, CLASSES, signature) if has_classes else None
    scores = _output(outputs, SCORES, signature) if has_scores else None
    if classes is not None:
        _check_matrix(classes, CLASSES, "DT_STRING", batch)
    if scores is not None:
        _check_matrix(scores, SCORES, "DT_FLOAT", batch)
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise InvalidArgument(
            "Tensors class and score should match in dim_size(1). "
            f"Got {classes.shape[1]} vs. {scores.shape[1]}"
        )
    num_classes = (classes if classes is not None else scores).shape[1]  # type: ignore[union-attr]
    labels = [[_label(v) for v in row] for row in classes] if classes is not None else None
    values = scores.tolist() if scores is not None else None
    return [
        [
            (labels[i][c] if labels is not None else "", values[i][c] if values is not None else 0.0)
            for c in range(num_classes)
        ]
        for i in range(batch)
    ]


def regression_results(outputs: Mapping[str, object], signature: SignatureDef, batch: int) -> list[float]:
    """Per example, its regression value (output shaped [batch] or [batch, 1], DT_FLOAT)."""
    _check_regress_outputs(signature)
    arr = _output(outputs, OUTPUTS, signature)
    if not (arr.ndim == 1 or (arr.ndim == 2 and arr.shape[1] == 1)):
        raise InvalidArgument(
            "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
            f"{_shape(arr)} for output '{OUTPUTS}'"
        )
    if arr.shape[0] != batch:
        raise InvalidArgument(f"Input batch size did not match output batch size: {batch} vs. {arr.shape[0]}")
    if _dtype_name(arr) != "DT_FLOAT":
        raise InvalidArgument(f"Expected output Tensor of DT_FLOAT.  Got: {_dtype_name(arr)}")
    return arr.reshape(-1).tolist()


def classification_result_proto(
    results: list[list[tuple[str, float]]],
) -> classification_pb2.ClassificationResult:
    """The same results as TF Serving's ClassificationResult proto (for gRPC)."""
    from tensorflow_serving.apis import classification_pb2  # loads TensorFlow: import only when needed

    proto = classification_pb2.ClassificationResult()
    for classes in results:
        classifications = proto.classifications.add()
        for label, score in classes:
            classifications.classes.add(label=label, score=score)
    return proto


def regression_result_proto(results: list[float]) -> regression_pb2.RegressionResult:
    """The same results as TF Serving's RegressionResult proto (for gRPC)."""
    from tensorflow_serving.apis import regression_pb2  # loads TensorFlow: import only when needed

    proto = regression_pb2.RegressionResult()
    for value in results:
        proto.regressions.add(value=value)
    return proto
