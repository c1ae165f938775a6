"""Triton's model configuration, both ways: what a repository load's parameters ask for
(`check_load_parameters`: honoured where it maps onto tfservo's settings, refused with the
reason where it does not, never ignored) and what the model configuration extension reports
(`model_config_doc`, from the signature and the settings the model was loaded with)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from tfservo.core.batching_options import BatchingOptions
from tfservo.core.errors import Internal, InvalidArgument, Unimplemented
from tfservo.models.model_config import VersionPolicy

__all__ = ["PLATFORM", "LoadConfig", "check_load_parameters", "model_config_doc"]

PLATFORM = "tensorflow_savedmodel"
_PLATFORMS = ("tensorflow_savedmodel", "tensorflow", "tensorflow_graphdef", "tflite")
_TRITON_TYPE = {"BYTES": "STRING"}  # a V2 datatype's name in Triton's DataType (TYPE_…), where it differs
# The ModelConfig fields a load may set, and why others are refused.
_HONOURED = ("name", "platform", "backend", "max_batch_size", "dynamic_batching", "version_policy")
_NAME_MAX = 255  # a path component longer than this is no file any repository could hold


@dataclass(frozen=True)
class LoadConfig:
    """What a load's `config` asks of the model: its batch bound and batching delay (the
    batcher's max_batch_size and batch_timeout_micros, allowed sizes from preferred_batch_size),
    and which versions it serves."""

    max_batch_size: int | None = None
    max_queue_delay_us: int | None = None
    preferred_batch_sizes: tuple[int, ...] = ()
    version_policy: VersionPolicy | None = None

    def batching(self, name: str, server: BatchingOptions | None) -> BatchingOptions | None:
        """The model's batching options: the server's with this config's fields; None when the
        config asks nothing of batching. InvalidArgument when the server does not batch."""
        if self.max_batch_size is None and self.max_queue_delay_us is None and not self.preferred_batch_sizes:
            return None
        if server is None:
            raise InvalidArgument(f"failed to load '{name}': max_batch_size and dynamic_batching need batching on; "
                                  "start the server with --batching auto (the default) or --enable-batching")
        size = self.max_batch_size or server.max_batch_size
        allowed = tuple(s for s in self.preferred_batch_sizes if s < size) + ((size,) if self.preferred_batch_sizes else ())
        try:
            return dataclasses.replace(
                server, max_batch_size=size, allowed_batch_sizes=allowed, max_enqueued_batches=0,
                batch_timeout_micros=server.batch_timeout_micros if self.max_queue_delay_us is None
                else self.max_queue_delay_us,
            )
        except ValueError as exc:
            raise InvalidArgument(f"failed to load '{name}': {exc}") from None


def check_load_parameters(name: str, parameters: Mapping[str, object]) -> LoadConfig | None:
    """A repository load's parameters as Triton defines them: `config`, the model configuration
    as JSON (its fields in `_HONOURED`; any other is refused naming it); `file:<path>` contents
    (a model sent in the request) are not taken, tfservo loads models from its model root;
    anything else is an unexpected parameter."""
    for key in parameters:
        if key != "config" and not key.startswith("file:"):
            raise InvalidArgument(f"failed to load '{name}': unexpected parameter '{key}'; a load takes 'config' "
                                  "(the model configuration as JSON)")
    files = [key for key in parameters if key.startswith("file:")]
    for key in files:
        if any(len(part.encode()) > _NAME_MAX for part in key[len("file:"):].split("/")):
            # Triton's own answer to a path no file system holds (its clients check the words and code)
            raise Internal(f"failed to load '{name}': failed to poll from model repository: {key[:64]}… has a path "
                           f"component longer than {_NAME_MAX} bytes")
    if files:
        raise Unimplemented(f"failed to load '{name}': model contents in the request ({files[0]!r}) are not "
                            "supported; put the model's version dirs under the model root and load it by name")
    if "config" not in parameters:
        return None
    text = parameters["config"]
    try:
        config = orjson.loads(text) if isinstance(text, (str, bytes)) else None
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"failed to load '{name}': the 'config' parameter is not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise InvalidArgument(f"failed to load '{name}': the 'config' parameter must be a JSON object, the "
                              "model configuration")
    unsupported = sorted(set(config) - set(_HONOURED))
    if unsupported:
        raise InvalidArgument(
            f"failed to load '{name}': config field(s) {', '.join(repr(k) for k in unsupported)} are not supported "
            f"(a load may set {', '.join(_HONOURED)}; inputs and outputs are the SavedModel's serving_default "
            "signature)"
        )
    if config.get("name") not in (None, "", name):
        raise InvalidArgument(f"failed to load '{name}': its config names model {config['name']!r}")
    for field in ("platform", "backend"):
        if config.get(field) not in (None, "", *_PLATFORMS):
            raise InvalidArgument(f"failed to load '{name}': {field} {config[field]!r} is not one tfservo serves "
                                  f"({', '.join(_PLATFORMS)})")
    batching = _object(name, config, "dynamic_batching")
    unknown = sorted(set(batching) - {"max_queue_delay_microseconds", "preferred_batch_size"})
    if unknown:
        raise InvalidArgument(f"failed to load '{name}': dynamic_batching field(s) {', '.join(unknown)} are not "
                              "supported (max_queue_delay_microseconds and preferred_batch_size are)")
    preferred = batching.get("preferred_batch_size", [])
    if not isinstance(preferred, list):
        raise InvalidArgument(f"failed to load '{name}': dynamic_batching.preferred_batch_size must be a list")
    max_batch_size = _number(name, config.get("max_batch_size"), "max_batch_size")
    if max_batch_size == 0:
        max_batch_size = None  # Triton's "no batching dimension": the dims say it, as without a config
    delay = _number(name, batching.get("max_queue_delay_microseconds"), "max_queue_delay_microseconds")
    sizes = tuple(sorted({_number(name, s, "preferred_batch_size") or 0 for s in preferred} - {0}))
    return LoadConfig(max_batch_size, delay, sizes, _policy(name, _object(name, config, "version_policy")))


def model_config_doc(
    name: str, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], batching: BatchingOptions | None,
    batched: bool, policy: VersionPolicy | None,
) -> dict[str, Any]:
    """Triton's ModelConfig fields for a model whose signature has `inputs` and `outputs` (V2
    metadata's tensors). With `batched` (a load's config set max_batch_size) the batch
    dimension is max_batch_size's, not one of the dims, as Triton writes it; else
    max_batch_size is 0 and dims include it (-1: any size)."""

    def tensors(specs: list[dict[str, Any]], with_format: bool) -> list[dict[str, object]]:
        out = []
        for t in specs:
            dims = list(t["shape"])
            if batched and dims and dims[0] == -1:
                dims = dims[1:]
            out.append({"name": t["name"], "data_type": f"TYPE_{_TRITON_TYPE.get(t['datatype'], t['datatype'])}",
                        **({"format": "FORMAT_NONE"} if with_format else {}), "dims": dims})
        return out

    doc: dict[str, Any] = {
        "name": name, "platform": PLATFORM, "backend": "tensorflow",
        "max_batch_size": batching.max_batch_size if batched and batching else 0,
        "input": tensors(inputs, True), "output": tensors(outputs, False),
    }
    if batching is not None:
        doc["dynamic_batching"] = {"max_queue_delay_microseconds": batching.batch_timeout_micros,
                                   "preferred_batch_size": list(batching.allowed_batch_sizes)}
    if policy is not None:
        doc["version_policy"] = ({"all": {}} if policy.kind == "all" else
                                 {"specific": {"versions": list(policy.versions)}} if policy.kind == "specific" else
                                 {"latest": {"num_versions": policy.num_versions}})
    return doc


def _object(name: str, config: Mapping[str, object], field: str) -> dict[str, object]:
    value = config.get(field) or {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"failed to load '{name}': {field} must be a JSON object")
    return value


def _number(name: str, value: object, field: str) -> int | None:
    """A ModelConfig integer: JSON's number or, as protobuf writes int64s, its digits in a string."""
    if value is None:
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"failed to load '{name}': {field} must be a non-negative integer, got {value!r}")
    return value


def _policy(name: str, policy: dict[str, object]) -> VersionPolicy | None:
    if not policy:
        return None
    if len(policy) != 1 or next(iter(policy)) not in ("latest", "all", "specific"):
        raise InvalidArgument(f"failed to load '{name}': version_policy must be one of latest, all or specific")
    kind, body = next(iter(policy.items()))
    if not isinstance(body, dict):
        raise InvalidArgument(f"failed to load '{name}': version_policy.{kind} must be a JSON object")
    if kind == "all":
        return VersionPolicy.all()
    if kind == "latest":
        return VersionPolicy.latest(_number(name, body.get("num_versions", 1), "num_versions") or 1)
    versions = body.get("versions")
    if not isinstance(versions, list) or not versions:
        raise InvalidArgument(f"failed to load '{name}': version_policy.specific.versions must list versions")
    return VersionPolicy.specific(_number(name, v, "versions") or 0 for v in versions)
