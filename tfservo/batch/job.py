"""A batch transform job: SageMaker's CreateTransformJob parameters as one validated value.

Each parameter is declared once, as a field of `TransformJob` made by `parameter(...)`: its
default, `tfservo transform`'s flag, its help, its choices, where CreateTransformJob's request
carries it and whether it decides what the outputs hold. The command's options
(`tfservo.cli.transform`), the SageMaker SDK's CreateTransformJob (`sagemaker_sdk.control_plane`),
the choice checks and the resume key all read `parameters()`. Names and values follow
SageMaker's API (`Line`, `MultiRecord`, `Input`, ...).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

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
    "JobParameter",
    "api_values",
    "parameters",
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
class JobParameter:
    """One declared job parameter: everything but its value."""

    name: str  # the TransformJob field
    flag: str  # tfservo transform's
    kind: type  # str, int, float, bool (a flag that only turns on) or dict (KEY=VALUE, repeatable)
    default: object
    help: str
    choices: tuple[str, ...] | None = None  # SageMaker's spelling; any case is accepted
    metavar: str | None = None
    api: tuple[str, ...] = ()  # the keys of CreateTransformJob's request that lead to it
    # a rerun with another value cannot resume the outputs; "packed": only where a request's
    # answer is a piece of the .out (a split object whose answers are concatenated)
    decides_output: bool | Literal["packed"] = False


def parameter(
    default: object,
    flag: str,
    *,
    help: str,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    api: tuple[str, ...] = (),
    decides_output: bool | Literal["packed"] = False,
) -> Any:
    """A TransformJob field with its declaration (name and kind come from the field)."""
    spec = dict(flag=flag, help=help, choices=choices, metavar=metavar, api=api, decides_output=decides_output)
    if isinstance(default, dict):
        return field(default_factory=dict, metadata={"parameter": spec})
    return field(default=default, metadata={"parameter": spec})


@dataclass(frozen=True)
class TransformJob:
    """Everything one transform run needs; `validated()` checks it and fills defaults."""

    model: str
    input: str
    output: str
    content_type: str | None = parameter(
        None, "--content-type", api=("TransformInput", "ContentType"), decides_output=True,
        help="Content type of every request, e.g. text/csv, application/jsonlines, application/x-image "
        "[default: application/json, as SageMaker sends for a job without a ContentType].")
    accept: str | None = parameter(
        None, "--accept", api=("TransformOutput", "Accept"), decides_output=True,
        help="Accept of each request [default: application/json].")
    split_type: str = parameter(
        "None", "--split-type", choices=SPLIT_TYPES, api=("TransformInput", "SplitType"), decides_output=True,
        help="How objects are cut into records; None sends each object whole.")
    batch_strategy: str = parameter(
        "MultiRecord", "--batch-strategy", choices=BATCH_STRATEGIES, api=("BatchStrategy",), decides_output="packed",
        help="MultiRecord packs records up to --max-payload per request; SingleRecord sends one each.")
    max_payload_mb: float = parameter(
        6.0, "--max-payload", metavar="MB", api=("MaxPayloadInMB",), decides_output="packed",
        help="Largest request body in MB (fractions allowed); a bigger single record fails its object.")
    max_concurrent_transforms: int = parameter(
        0, "--max-concurrent-transforms", metavar="N", api=("MaxConcurrentTransforms",),
        help="Requests in flight at once [default: one per CPU core; on Ray and Spark, one per CPU each worker owns].")
    assemble_with: str = parameter(
        "None", "--assemble-with", choices=ASSEMBLE_WITH, api=("TransformOutput", "AssembleWith"),
        decides_output=True,
        help="Line: one output line per record (answers split per record); None: bodies concatenated.")
    input_filter: str | None = parameter(
        None, "--input-filter", metavar="JSONPATH", api=("DataProcessing", "InputFilter"), decides_output=True,
        help="Part of each CSV/JSON record to send, e.g. '$[1:]' (drop an id column) or '$.features'.")
    output_filter: str | None = parameter(
        None, "--output-filter", metavar="JSONPATH", api=("DataProcessing", "OutputFilter"), decides_output=True,
        help="Part of each (joined) output record to keep, e.g. '$[0,-1]' or \"$['id','SageMakerOutput']\".")
    join_source: str = parameter(
        "None", "--join-source", choices=JOIN_SOURCES, api=("DataProcessing", "JoinSource"), decides_output=True,
        help="Input: join each output to its input record (CSV: appended columns; JSON: SageMakerOutput).")
    compression_type: str = parameter(
        "None", "--compression-type", choices=COMPRESSION_TYPES, api=("TransformInput", "CompressionType"),
        decides_output=True, help="Gzip: input objects are gzip files (outputs are not compressed).")
    data_type: str = parameter(
        "S3Prefix", "--data-type", choices=DATA_TYPES, api=("TransformInput", "DataSource", "S3DataSource", "S3DataType"),
        help="S3Prefix: INPUT is a folder, file or prefix; ManifestFile: INPUT is a SageMaker manifest "
        "([{\"prefix\": ...}, \"key\", ...]).")
    custom_attributes: str | None = parameter(
        None, "--custom-attributes", decides_output=True,
        help="X-Amzn-SageMaker-Custom-Attributes sent with each request, e.g. 'tfs-model-name=m,tfs-method=regress'.")
    env: dict[str, str] = parameter(
        {}, "--env", metavar="KEY=VALUE", decides_output=True,
        help="Environment for the model service, set before it loads (repeatable), "
        "e.g. SAGEMAKER_TFS_DEFAULT_MODEL_NAME=half_plus_three.")
    on_record_error: str = parameter(
        "fail", "--on-record-error", choices=ON_RECORD_ERROR, decides_output=True,
        help="fail: a bad record fails its object (SageMaker's way); skip: write --placeholder for it, "
        "put it in <name>.deadletter.jsonl and go on.")
    placeholder: str = parameter(
        "", "--placeholder", metavar="TEXT", decides_output=True,
        help="Output line written for a skipped record [default: an empty line].")
    overwrite: bool = parameter(
        False, "--overwrite",
        help="Redo every object; by default objects whose .out exists are skipped (resume).")
    state_dir: str | None = parameter(  # None: beside OUTPUT (see state_url)
        None, "--state-dir", metavar="URL",
        help="Where the job's description (for resume), failure report and dead letters go, so that "
        "OUTPUT holds only .out files [default: <OUTPUT>.tfservo-state, beside OUTPUT].")
    data_capture: str | None = parameter(
        None, "--data-capture", metavar="DEST", api=("DataCaptureConfig", "DestinationS3Uri"),
        help="Data Capture (SageMaker's BatchDataCaptureConfig DestinationS3Uri): each request and its answer "
        "as a line of Model Monitor's format, one file per object under DEST/yyyy/mm/dd/hh/, published with "
        "its .out; DEST is a folder or an s3:// prefix.")
    generate_inference_id: bool = parameter(
        False, "--generate-inference-id", api=("DataCaptureConfig", "GenerateInferenceId"),
        help="With --data-capture (BatchDataCaptureConfig's GenerateInferenceId): each captured request's "
        "inferenceId is OBJECT:RECORD, naming the object and its first record.")
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

    def output_flags(self) -> dict[str, object]:
        """The flags that decide what the outputs hold, by flag name: a rerun with other values
        cannot resume these outputs."""
        packing = self.split_type != "None" and not self.per_record  # each answer is a piece of the .out
        flags: dict[str, object] = {}
        for declared in parameters():
            if declared.decides_output is True or (packing and declared.decides_output == "packed"):
                value = getattr(self, declared.name)
                flags[declared.flag] = dict(sorted(value.items())) if isinstance(value, dict) else value
        return flags

    def validated(self) -> TransformJob:
        """The job with canonical spellings, or JobError naming the flag that is wrong."""
        values = {
            declared.name: _choice(declared.flag, getattr(self, declared.name), declared.choices)
            for declared in parameters()
            if declared.choices
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


def parameters() -> tuple[JobParameter, ...]:
    """Every declared parameter, in the order `tfservo transform --help` lists them."""
    return _PARAMETERS


def _declared() -> tuple[JobParameter, ...]:
    declared = []
    for item in fields(TransformJob):
        spec = item.metadata.get("parameter")
        if spec is None:
            continue
        default = item.default_factory() if item.default_factory is not dataclasses.MISSING else item.default
        kind = type(default) if default is not None else str
        declared.append(JobParameter(name=item.name, kind=kind, default=default, **spec))
    return tuple(declared)


_PARAMETERS = _declared()


def api_values(request: Mapping[str, object]) -> list[tuple[JobParameter, object]]:
    """The declared parameters a CreateTransformJob request gives, with their values."""
    values = []
    for declared in _PARAMETERS:
        node: object = request
        for key in declared.api:
            node = node.get(key) if isinstance(node, Mapping) else None
        if declared.api and node is not None:
            values.append((declared, node))
    return values


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
