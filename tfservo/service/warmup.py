"""SavedModel warmup: replay `assets.extra/tf_serving_warmup_requests` before a version serves.

The file is a TFRecord of `PredictionLog` protos, as TF Serving reads it: `predict_log`,
`classify_log`, `regress_log` and `multi_inference_log` records are replayed once each through
the TF Serving API's array-level calls on the version being loaded (so the first real request
does not pay for graph warm-up). At most 1000 records, as in TF Serving. Any failure — an
unreadable file, an unparsable record, a request the model rejects — fails that version with
an error naming the file and the record.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from typing import Any

from tfservo.core.errors import Code, InvalidArgument, ServingError, Unimplemented
from tfservo.models.calls import ExamplesCall, PredictCall
from tfservo.models.servables import ServableVersion
from tfservo.models.signatures import CLASSIFY_METHOD, REGRESS_METHOD
from tfservo.service.api import TFServingAPI

__all__ = ["MAX_RECORDS", "WARMUP_FILE", "DataLoss", "replay_warmup", "serialized_examples", "warmup_path"]

log = logging.getLogger("tfservo.warmup")

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
MAX_RECORDS = 1000  # TF Serving's kMaxNumRecords


class DataLoss(ServingError):
    """The warmup file is unreadable or holds something other than PredictionLogs."""

    code = Code.DATA_LOSS


def warmup_path(version_dir: str) -> str | None:
    """The version's warmup file, or None when it has none."""
    path = os.path.join(version_dir, WARMUP_FILE)
    return path if os.path.isfile(path) else None


def replay_warmup(api: TFServingAPI, sv: ServableVersion) -> int:
    """Replay the warmup records of `sv` (loaded, not yet AVAILABLE); returns how many ran."""
    path = warmup_path(sv.path)
    if path is None:
        return 0
    where = f"warmup file {path} of model {sv.model_name} version {sv.version}"
    count = 0
    for index, record in enumerate(_records(path, where), start=1):
        if index > MAX_RECORDS:
            raise InvalidArgument(
                f"{where} has more than {MAX_RECORDS} records, TF Serving's limit; keep a few "
                "representative requests"
            )
        log_type = record.WhichOneof("log_type")
        try:
            _replay(api, sv, record, log_type)
        except ServingError as exc:
            raise type(exc)(
                f"{where}: record {index} ({log_type}) failed: {exc.message}; fix the record or "
                "remove the file",
                exc.code,
            ) from None
        count = index
    log.info(
        "model %s version %d: replayed %d warmup request(s) from %s", sv.model_name, sv.version, count, path
    )
    return count


def _records(path: str, where: str) -> Iterator[Any]:
    """Parsed PredictionLog records of a TFRecord file."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError
    from tensorflow_serving.apis import prediction_log_pb2

    try:
        dataset = iter(tf.data.TFRecordDataset(path))
    except (tf.errors.OpError, ValueError) as exc:
        raise DataLoss(f"cannot read {where}: {_first_line(exc)}") from None
    index = 0
    while True:
        index += 1
        try:
            raw = next(dataset)
        except StopIteration:
            return
        except tf.errors.OpError as exc:
            raise DataLoss(
                f"{where} is not a valid TFRecord file (at record {index}): {_first_line(exc)}; "
                "write it with tf.io.TFRecordWriter, one serialized PredictionLog per record"
            ) from None
        record = prediction_log_pb2.PredictionLog()
        try:
            record.ParseFromString(raw.numpy())
        except DecodeError as exc:
            raise DataLoss(f"{where}: record {index} is not a serialized PredictionLog: {exc}") from None
        yield record


def _replay(api: TFServingAPI, sv: ServableVersion, record: Any, log_type: str | None) -> None:
    if log_type == "predict_log":
        request = record.predict_log.request
        inputs = {key: _to_array(proto, key) for key, proto in request.inputs.items()}
        output_keys = tuple(request.output_filter) or None
        api.run(sv, PredictCall(request.model_spec.signature_name, inputs, True, output_keys))
    elif log_type == "classify_log":
        request = record.classify_log.request
        api.run(sv, ExamplesCall("classify", request.model_spec.signature_name, serialized_examples(request.input)))
    elif log_type == "regress_log":
        request = record.regress_log.request
        api.run(sv, ExamplesCall("regress", request.model_spec.signature_name, serialized_examples(request.input)))
    elif log_type == "multi_inference_log":
        request = record.multi_inference_log.request
        examples = serialized_examples(request.input)
        for task in request.tasks:
            if task.method_name == CLASSIFY_METHOD:
                api.run(sv, ExamplesCall("classify", task.model_spec.signature_name, examples))
            elif task.method_name == REGRESS_METHOD:
                api.run(sv, ExamplesCall("regress", task.model_spec.signature_name, examples))
            else:
                raise Unimplemented(
                    f"multi-inference task method {task.method_name!r} is not supported; "
                    f"use {CLASSIFY_METHOD} or {REGRESS_METHOD}"
                )
    else:
        raise Unimplemented(
            f"log type {log_type or 'unset'} cannot be replayed; use predict_log, classify_log, "
            "regress_log or multi_inference_log"
        )


def serialized_examples(input_proto: Any) -> list[bytes]:
    """A tensorflow_serving Input → serialized tf.Examples (context merged into each, as TF Serving does).

    Concatenating two serialized protos parses as their merge, so context + example gives each
    example the context's features, with the example's own winning on a clash.
    """
    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        return [e.SerializeToString() for e in input_proto.example_list.examples]
    if kind == "example_list_with_context":
        data = input_proto.example_list_with_context
        context = data.context.SerializeToString()
        return [context + e.SerializeToString() for e in data.examples]
    raise InvalidArgument("Input is empty: set example_list or example_list_with_context")


def _to_array(proto: Any, key: str) -> Any:
    from tfservo.codecs.tensor_proto import to_ndarray  # the gRPC codec; imports TF protos

    return to_ndarray(proto, f"input {key!r}")


def _first_line(exc: BaseException) -> str:
    """The readable part of a TF error: first line, without TF's {{function_node ...}} and [Op:...]."""
    text = getattr(exc, "message", None) or str(exc)
    text = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", text) or type(exc).__name__
