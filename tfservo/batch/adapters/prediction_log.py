"""TF Serving PredictionLog protos, one per element, in the shape tfx-bsl's RunInference emits.

predict_log: the request holds the element's inputs as tensors with a batch dimension of 1,
the response its outputs sliced the same way (tfx-bsl's "mimic tensor::Split"), written by
the gRPC endpoint's tensor codec (numbers in the typed value fields, as TF Serving answers);
classify_log / regress_log: the request holds the element's tf.train.Example in
input.example_list, the response its one Classifications / Regression. Unlike tfx-bsl, both
request and response also carry the model_spec (name, version, signature), as TF Serving's
own responses do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any  # PredictionLog: generated messages, untyped

import numpy as np

from tfservo.batch.worker.batches import Part
from tfservo.batch.worker.target import Target
from tfservo.codecs.tensor_proto import write_tensor_proto

__all__ = ["classify_logs", "logs", "predict_logs", "regress_logs"]


def _template(kind: str, target: Target) -> bytes:
    """A serialized PredictionLog with only the model_spec of request and response filled in.

    Parsing it per element is cheaper than filling both model_specs field by field.
    """
    from tensorflow_serving.apis import prediction_log_pb2

    log = prediction_log_pb2.PredictionLog()
    for spec in (getattr(log, kind).request.model_spec, getattr(log, kind).response.model_spec):
        spec.name = target.model_name or ""
        if target.version is not None:
            spec.version.value = target.version
        spec.signature_name = target.signature.name if target.signature else ""
    serialized: bytes = log.SerializeToString()
    return serialized


def logs(target: Target, part: Part, model_id: str | None = None) -> list[Any]:
    """One PredictionLog per element of a batch part that the model answered whole; `model_id`
    (what PredictionResult.model_id would say) goes in log_metadata.model_spec.name."""
    if target.method == "predict":
        out = predict_logs(target, part.inputs, part.outputs, len(part.elements))
    elif target.method == "classify":
        out = classify_logs(target, part.inputs, part.results)
    else:
        out = regress_logs(target, part.inputs, part.results)
    if model_id is not None:
        for log in out:
            log.log_metadata.model_spec.name = model_id
    return out


def predict_logs(
    target: Target, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], batch_size: int
) -> list[Any]:
    """One PredictionLog(predict_log=...) per element of a predict batch."""
    from tensorflow_serving.apis import prediction_log_pb2

    template = _template("predict_log", target)
    logs = []
    for i in range(batch_size):
        log = prediction_log_pb2.PredictionLog.FromString(template)
        request, response = log.predict_log.request, log.predict_log.response
        for key, arr in inputs.items():
            write_tensor_proto(arr[i : i + 1], request.inputs[key], f"input '{key}'")
        for key, arr in outputs.items():
            write_tensor_proto(arr[i : i + 1], response.outputs[key], f"output '{key}'")
        logs.append(log)
    return logs


def classify_logs(
    target: Target, examples: Sequence[bytes], results: Sequence[list[tuple[str, float]]]
) -> list[Any]:
    """One PredictionLog(classify_log=...) per example."""
    from tensorflow_serving.apis import prediction_log_pb2

    template = _template("classify_log", target)
    logs = []
    for serialized, classes in zip(examples, results):
        log = prediction_log_pb2.PredictionLog.FromString(template)
        request, response = log.classify_log.request, log.classify_log.response
        request.input.example_list.examples.add().ParseFromString(serialized)
        classifications = response.result.classifications.add()
        for label, score in classes:
            classifications.classes.add(label=label, score=score)
        logs.append(log)
    return logs


def regress_logs(target: Target, examples: Sequence[bytes], results: Sequence[float]) -> list[Any]:
    """One PredictionLog(regress_log=...) per example."""
    from tensorflow_serving.apis import prediction_log_pb2

    template = _template("regress_log", target)
    logs = []
    for serialized, value in zip(examples, results):
        log = prediction_log_pb2.PredictionLog.FromString(template)
        request, response = log.regress_log.request, log.regress_log.response
        request.input.example_list.examples.add().ParseFromString(serialized)
        response.result.regressions.add(value=value)
        logs.append(log)
    return logs
