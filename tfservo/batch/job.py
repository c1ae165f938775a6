"""A batch transform job: SageMaker's CreateTransformJob parameters as one validated value.

The CLI turns flags into a TransformJob; the local engine (and any other runner) takes one.
Names and values follow SageMaker's API (`Line`, `MultiRecord`, `Input`, ...).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from tfservo.batch.jsonpath import JsonPath, JsonPathError, parse_jsonpath
from tfservo.codecs.media_types import record_kind
from tfservo.core.errors import InvalidArgument

__all__ = [
    "ASSEMBLE_WITH",
    "BATCH_STRATEGIES",
    "COMPRESSION_TYPES",
    "DATA_TYPES",
    "JOIN_SOURCES",
    "ON_RECORD_ERROR",
    "SPLIT_TYPES",
    "JobError",
    "parse_env",
    "record_format",
    "TransformJob",
]

SPLIT_TYPES = ("None", "Line", "RecordIO", "TFRecord")
BATCH_STRATEGIES = ("MultiRecord", "SingleRecord")
ASSEMBLE_WITH = ("None", "Line")
JOIN_SOURCES = ("None", "Input")
COMPRESSION_TYPES = ("None", "Gzip")
DATA_TYPES = ("S3Prefix", "ManifestFile")
ON_RECORD_ERROR = ("fail", "skip")



class JobError(InvalidArgument):
    """A job parameter, or a combination of them, that cannot work; the message says which."""


@dataclass(frozen=True)
class TransformJob:
    """Everything one transform run needs; `validated()` checks it and fills defaults."""

    model: str
    input: str
    output: str
    content_type: str | None = None
    accept: str | None = None
    split_type: str = "None"
    batch_strategy: str = "MultiRecord"
    max_payload_mb: float = 6.0
    max_concurrent_transforms: int = 0  # 0: one per CPU core
    assemble_with: str = "None"
    input_filter: str | None = None
    output_filter: str | None = None
    join_source: str = "None"
    compression_type: str = "None"
    data_type: str = "S3Prefix"
    custom_attributes: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    on_record_error: str = "fail"
    placeholder: str = ""
    overwrite: bool = False
    state_dir: str | None = None  # None: beside OUTPUT (see state_url)
    data_capture: str | None = None  # BatchDataCaptureConfig's DestinationS3Uri: a folder or s3:// prefix
    generate_inference_id: bool = False  # ... and its GenerateInferenceId
    trace_parent: str | None = None  # the job span's W3C traceparent, for workers' request spans

    @property
    def max_payload_bytes(self) -> int:
        return int(self.max_payload_mb * 2**20)

    @property
    def state_url(self) -> str:
        """Where the job's description, failure report and dead letters go: --state-dir, else
        `<OUTPUT>.tfservo-state` beside OUTPUT, so that OUTPUT holds only .out files."""
        return self.state_dir or default_state_dir(self.output)

    @property
    def concurrency(self) -> int:
        return self.max_concurrent_transforms or (os.cpu_count() or 1)

    @property
    def per_record(self) -> bool:
        """Whether each record gets its own output line (vs. response bodies concatenated)."""
        return (
            (self.split_type != "None" and self.assemble_with == "Line")
            or self.join_source == "Input"
            or self.output_filter_path is not None
        )

    @property
    def input_filter_path(self) -> JsonPath | None:
        return _path(self.input_filter)

    @property
    def output_filter_path(self) -> JsonPath | None:
        return _path(self.output_filter)

    @property
    def reads_records(self) -> bool:
        """Whether the job looks inside input records (--input-filter, --join-source Input)."""
        return self.input_filter_path is not None or self.join_source == "Input"

    @property
    def uses_data_processing(self) -> bool:
        return (
            self.input_filter_path is not None
            or self.output_filter_path is not None
            or self.join_source == "Input"
        )

    def output_flags(self) -> dict[str, Any]:
        """The flags that decide what the outputs hold, by flag name: a rerun with other values
        cannot resume these outputs. Request packing counts only where answers are concatenated."""
        flags: dict[str, Any] = {
            "--content-type": self.content_type,
            "--accept": self.accept,
            "--split-type": self.split_type,
            "--assemble-with": self.assemble_with,
            "--input-filter": self.input_filter,
            "--output-filter": self.output_filter,
            "--join-source": self.join_source,
            "--compression-type": self.compression_type,
            "--custom-attributes": self.custom_attributes,
            "--env": dict(sorted(self.env.items())),
            "--on-record-error": self.on_record_error,
            "--placeholder": self.placeholder,
        }
        if self.split_type != "None" and not self.per_record:  # each request's answer is a piece of the .out
            flags["--batch-strategy"] = self.batch_strategy
            flags["--max-payload"] = self.max_payload_mb
        return flags

    def validated(self) -> TransformJob:
        """The job with canonical spellings, or JobError naming the flag that is wrong."""
        values = {
            "split_type": _choice("--split-type", self.split_type, SPLIT_TYPES),
            "batch_strategy": _choice("--batch-strategy", self.batch_strategy, BATCH_STRATEGIES),
            "assemble_with": _choice("--assemble-with", self.assemble_with, ASSEMBLE_WITH),
            "join_source": _choice("--join-source", self.join_source, JOIN_SOURCES),
            "compression_type": _choice("--compression-type", self.compression_type, COMPRESSION_TYPES),
            "data_type": _choice("--data-type", self.data_type, DATA_TYPES),
            "on_record_error": _choice("--on-record-error", self.on_record_error, ON_RECORD_ERROR),
        }
        job = TransformJob(**{**asdict(self), **values})
        job._check()
        return job

    def _check(self) -> None:
        if self.generate_inference_id and not self.data_capture:
            raise JobError("--generate-inference-id names the requests in the capture: add --data-capture DEST")
        if not self.max_payload_mb > 0:
            raise JobError(f"--max-payload {self.max_payload_mb:g} must be more than 0 MB (e.g. 6 or 0.5)")
        if self.max_concurrent_transforms < 0:
            raise JobError(
                f"--max-concurrent-transforms {self.max_concurrent_transforms} must be 1 or more "
                "(0 means one per CPU core)"
            )
        for flag, text in (("--input-filter", self.input_filter), ("--output-filter", self.output_filter)):
            if text is not None:
                try:
                    parse_jsonpath(text)
                except JsonPathError as exc:
                    raise JobError(f"{flag}: {exc}") from None
        if self.uses_data_processing:
            needs_lines = self.join_source == "Input" or self.output_filter_path is not None
            if needs_lines and self.split_type == "Line" and self.assemble_with != "Line":
                raise JobError(
                    "--join-source Input and --output-filter give one output line per input line: "
                    "add --assemble-with Line"
                )
        if self.reads_records:  # the output filter works on the answer, whatever the input is
            if self.split_type in ("RecordIO", "TFRecord"):
                raise JobError(
                    "--input-filter and --join-source work on CSV and JSON records; they cannot be "
                    f"used with --split-type {self.split_type} (use Line or None)"
                )
            if self.content_type and record_format(self.content_type) is None:
                raise JobError(
                    f"--input-filter and --join-source need CSV or JSON records, but --content-type "
                    f"is {self.content_type}; use text/csv, application/json or application/jsonlines "
                    "(--output-filter alone works with any input: it filters the answer)"
                )
        for key in self.env:
            if not key or "=" in key:
                raise JobError(f"--env {key!r}: expected KEY=VALUE")
        if self.state_dir is None:
            default_state_dir(self.output)  # a bucket's root has no place beside it


STATE_SUFFIX = ".tfservo-state"


def default_state_dir(output: str) -> str:
    """`<OUTPUT>.tfservo-state`: beside OUTPUT, not inside it; JobError for a bucket's root."""
    stripped = output.rstrip("/")
    scheme, sep, rest = stripped.partition("://")
    if sep and "/" not in rest:
        raise JobError(
            f"OUTPUT {output} is a bucket's root: tfservo keeps the job's state (description, failure "
            "report, dead letters) beside OUTPUT so that OUTPUT holds only .out files, and a bucket's "
            "root has nothing beside it; pass --state-dir (e.g. s3://bucket/transform-state/)"
        )
    if not stripped:
        raise JobError(f"OUTPUT {output!r} is not a folder or prefix; pass --state-dir")
    return stripped + STATE_SUFFIX


def record_format(content_type: str | None) -> str | None:
    """'csv' or 'json' for content types whose records filters and join understand, else None."""
    return record_kind(content_type) if content_type else None


def parse_env(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`KEY=VALUE` flags → a dict; JobError for anything else."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise JobError(f"--env {pair!r} is not KEY=VALUE (e.g. SAGEMAKER_TFS_DEFAULT_MODEL_NAME=half_plus_three)")
        env[key.strip()] = value
    return env


def _choice(flag: str, value: str, allowed: tuple[str, ...]) -> str:
    for option in allowed:
        if value.lower() == option.lower():
            return option
    raise JobError(f"{flag} {value!r} is not one of {', '.join(allowed)}")


def _path(text: str | None) -> JsonPath | None:
    if text is None or not text.strip():
        return None
    path = parse_jsonpath(text)
    return None if path.is_root else path
