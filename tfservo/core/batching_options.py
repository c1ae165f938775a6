"""Batching options, from SageMaker's environment variables or a TF Serving parameters file."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AUTO_BATCH_THREADS", "AUTO_MAX_BATCH_SIZE", "BATCHING_VARIABLES", "ENABLE_VAR", "BatchingOptions"]


def _cores() -> int:
    return os.cpu_count() or 1


ENABLE_VAR = "SAGEMAKER_TFS_ENABLE_BATCHING"
# The largest batch of the default (adaptive) batching: batch 32 costs a small model little more
# than batch 1 per call (bench/ceiling.py), and it is what the serving benchmark batches.
AUTO_MAX_BATCH_SIZE = 32
# Its batch threads, shared by every model: as many as the thread pool that runs calls without
# batching, so that one model's slow batches never hold up another model's (TF Serving's
# num_batch_threads, the core count, would: two 2-second batches stall every other model).
AUTO_BATCH_THREADS = 64
# Single-row requests the default queue holds before it refuses with 429.
QUEUED_REQUESTS = 1024
_INT_VARS = {
    "max_batch_size": "SAGEMAKER_TFS_MAX_BATCH_SIZE",
    "batch_timeout_micros": "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS",
    "num_batch_threads": "SAGEMAKER_TFS_NUM_BATCH_THREADS",
    "max_enqueued_batches": "SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES",
}
# every variable `from_env` reads: what a config file may set by its variable's name
BATCHING_VARIABLES = (ENABLE_VAR, *_INT_VARS.values())
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}

# TF Serving's own defaults for fields a parameters file leaves out (SharedBatchScheduler's
# QueueOptions), so a file behaves as it would under tensorflow_model_server.
_FILE_DEFAULTS = {"max_batch_size": 1000, "batch_timeout_micros": 0, "max_enqueued_batches": 10}


@dataclass(frozen=True)
class BatchingOptions:
    """How requests are merged into model calls (the fields of TF Serving's BatchingParameters)."""

    max_batch_size: int = 8
    batch_timeout_micros: int = 1000
    num_batch_threads: int = field(default_factory=_cores)
    # 0: as many batches as QUEUED_REQUESTS single-row requests fill (SageMaker's container uses
    # the core count, which turned away 39 % of a 64-client load the server could absorb)
    max_enqueued_batches: int = 0
    allowed_batch_sizes: tuple[int, ...] = ()
    eager: bool = False
    adaptive: bool = False  # tfservo's default: see tfservo.models.batching.batcher

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_batch_sizes", tuple(self.allowed_batch_sizes))
        if self.max_enqueued_batches == 0 and self.max_batch_size >= 1:
            derived = max(_cores(), math.ceil(QUEUED_REQUESTS / self.max_batch_size))
            object.__setattr__(self, "max_enqueued_batches", derived)
        for name in ("max_batch_size", "num_batch_threads", "max_enqueued_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"batching option {name}={getattr(self, name)} must be at least 1")
        if self.batch_timeout_micros < 0:
            raise ValueError(
                f"batching option batch_timeout_micros={self.batch_timeout_micros} must be 0 or more"
            )
        sizes = self.allowed_batch_sizes
        if sizes:
            if any(s < 1 for s in sizes) or any(a >= b for a, b in zip(sizes, sizes[1:])):
                raise ValueError(
                    f"allowed_batch_sizes {list(sizes)} must be positive and strictly increasing"
                )
            if sizes[-1] != self.max_batch_size:
                raise ValueError(
                    f"the last of allowed_batch_sizes {list(sizes)} must equal max_batch_size "
                    f"({self.max_batch_size}); add it or change max_batch_size"
                )

    @property
    def mode(self) -> str:
        """--batching's name for these options: auto, eager or timeout."""
        return "auto" if self.adaptive else "eager" if self.eager else "timeout"

    @property
    def batch_timeout_seconds(self) -> float:
        return self.batch_timeout_micros / 1e6

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> BatchingOptions | None:
        """Options from SageMaker's SAGEMAKER_TFS_* variables (as tfservo.core.settings hands them);
        None unless batching is enabled."""
        raw = env.get(ENABLE_VAR, "").strip().lower()
        if raw in _FALSE or raw == "":
            return None
        if raw not in _TRUE:
            raise ValueError(f"environment variable {ENABLE_VAR}={raw!r} must be 'true' or 'false'")
        values: dict[str, Any] = {}
        for name, var in _INT_VARS.items():
            text = env.get(var, "").strip()
            if not text:
                continue
            try:
                values[name] = int(text)
            except ValueError:
                raise ValueError(f"environment variable {var}={text!r} must be an integer") from None
        try:
            return cls(**values)
        except ValueError as exc:
            names = ", ".join(_INT_VARS[n] for n in values) or "defaults"
            raise ValueError(f"batching environment variables ({names}) are invalid: {exc}") from None

    @classmethod
    def from_parameters_file(cls, path: str | os.PathLike[str]) -> BatchingOptions:
        """Options from a TF Serving --batching_parameters_file (BatchingParameters text proto)."""
        from google.protobuf import text_format

        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ValueError(f"cannot read batching parameters file {path}: {exc}") from None
        params = _batching_parameters_class()()
        try:
            text_format.Parse(text, params)
        except text_format.ParseError as exc:
            raise ValueError(
                f"batching parameters file {path} is not a valid BatchingParameters text proto: "
                f"{exc}; write fields like 'max_batch_size {{ value: 32 }}' and "
                "'allowed_batch_sizes: 8'"
            ) from None

        values: dict[str, Any] = {"num_batch_threads": _cores(), **_FILE_DEFAULTS}
        for name in ("max_batch_size", "batch_timeout_micros", "num_batch_threads", "max_enqueued_batches"):
            if params.HasField(name):
                values[name] = getattr(params, name).value
        # With large-batch splitting TF Serving runs batches of max_execution_batch_size; this
        # batcher always splits, so that is the batch size that matters.
        if (
            params.HasField("enable_large_batch_splitting")
            and params.enable_large_batch_splitting.value
            and params.HasField("max_execution_batch_size")
        ):
            values["max_batch_size"] = params.max_execution_batch_size.value
        values["allowed_batch_sizes"] = tuple(params.allowed_batch_sizes)
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"batching parameters file {path}: {exc}") from None


_PARAMS_CLASS: object = None


def _batching_parameters_class() -> Any:
    """TF Serving's BatchingParameters message class (built here when the pip API lacks it)."""
    global _PARAMS_CLASS
    if _PARAMS_CLASS is None:
        try:
            from tensorflow_serving.servables.tensorflow import session_bundle_config_pb2

            _PARAMS_CLASS = session_bundle_config_pb2.BatchingParameters
        except ImportError:  # tensorflow-serving-api ships only apis/ and config/
            _PARAMS_CLASS = _build_batching_parameters()
    return _PARAMS_CLASS


# (name, number, wrapper type or scalar, repeated) as in session_bundle_config.proto.
_FIELDS = [
    ("max_batch_size", 1, ".google.protobuf.Int64Value", False),
    ("batch_timeout_micros", 2, ".google.protobuf.Int64Value", False),
    ("max_enqueued_batches", 3, ".google.protobuf.Int64Value", False),
    ("num_batch_threads", 4, ".google.protobuf.Int64Value", False),
    ("thread_pool_name", 5, ".google.protobuf.StringValue", False),
    ("allowed_batch_sizes", 6, "int64", True),
    ("pad_variable_length_inputs", 7, "bool", False),
    ("enable_large_batch_splitting", 8, ".google.protobuf.BoolValue", False),
    ("max_execution_batch_size", 9, ".google.protobuf.Int64Value", False),
    ("batch_padding_policy", 10, "string", False),
]


def _build_batching_parameters() -> object:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    F = descriptor_pb2.FieldDescriptorProto
    scalars = {"int64": F.TYPE_INT64, "bool": F.TYPE_BOOL, "string": F.TYPE_STRING}
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(wrappers_pb2.DESCRIPTOR.serialized_pb))
    fdp = descriptor_pb2.FileDescriptorProto(
        name="tfservo/batching_parameters.proto",
        package="tensorflow.serving",
        syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"],
    )
    msg = fdp.message_type.add(name="BatchingParameters")
    for name, number, kind, repeated in _FIELDS:
        label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
        if kind in scalars:
            msg.field.add(name=name, number=number, label=label, type=scalars[kind])
        else:
            msg.field.add(name=name, number=number, label=label, type=F.TYPE_MESSAGE, type_name=kind)
    pool.Add(fdp)
    descriptor = pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters")
    return message_factory.GetMessageClass(descriptor)
