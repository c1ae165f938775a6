"""Data Capture for batch transform (SageMaker's BatchDataCaptureConfig): each request the job
sends, with the answer it got, as one line of Model Monitor's capture format.

The lines of an object's requests travel with its answers, in order, and are published with
its .out — one capture file per object, under `{--data-capture}/yyyy/mm/dd/hh/` — so a capture
file exists exactly when its object's output does, on every engine, never half-written. A
rerun that redoes an object captures its requests again, as SageMaker would.
"""

from __future__ import annotations

import time

from tfservo.batch.job import TransformJob
from tfservo.batch.sinks import ObjectWriter, OutputStore
from tfservo.batch.sources import InputObject
from tfservo.capture.config import CaptureConfig
from tfservo.capture.writer import CaptureEvent, capture_line
from tfservo.codecs.media_types import CSV_TYPES, JSON_TYPES

__all__ = ["capture_writer", "request_capture"]


def _config(job: TransformJob) -> CaptureConfig:
    assert job.data_capture is not None
    return CaptureConfig(job.data_capture, csv_content_types=CSV_TYPES, json_content_types=JSON_TYPES)


def request_capture(
    job: TransformJob, body: bytes, content_type: str, answer: bytes, answer_type: str, sent_at: float, record: int,
    rel: str,
) -> bytes:
    """One request's capture line; with --generate-inference-id its inferenceId is
    `{object}:{first record}`, which names where in the input its records are."""
    inference_id = f"{rel}:{record}" if job.generate_inference_id else None
    event = CaptureEvent(body, content_type, answer, answer_type, inference_id, sent_at)
    return capture_line(_config(job), event)


def capture_writer(job: TransformJob, obj: InputObject) -> ObjectWriter | None:
    """A writer for the capture file of `obj` (None when the job captures nothing); committed
    with the object's .out, aborted with it."""
    if job.data_capture is None:
        return None
    hour = time.strftime("%Y/%m/%d/%H", time.gmtime())
    return OutputStore(job.data_capture).writer(f"{hour}/{obj.rel}.jsonl")
