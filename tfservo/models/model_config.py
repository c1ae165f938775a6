"""TF Serving's model config file (`--model_config_file`): the text `ModelServerConfig` proto.

Parsed into plain dataclasses: which models to serve, from which base path, under which
version policy (`latest { num_versions }`, `all {}`, `specific { versions }`) and with which
version labels. The proto definitions come from tensorflow-serving-api, so any file TF Serving
accepts parses here, and a HandleReloadConfigRequest's `config` can be passed as it is.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tfservo.core.errors import InvalidArgument
from tfservo.models.bundle import is_model_name

__all__ = [
    "CONFIG_DOCS",
    "ModelConfig",
    "parse_model_server_config",
    "read_model_config_file",
    "single_model_config",
    "VersionPolicy",
]

CONFIG_DOCS = "https://www.tensorflow.org/tfx/serving/serving_config#model_server_configuration"


@dataclass(frozen=True)
class VersionPolicy:
    """Which of the version dirs found under a base path are served (TF Serving's ServableVersionPolicy)."""

    kind: str  # "latest" | "all" | "specific"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    @classmethod
    def latest(cls, num_versions: int = 1) -> VersionPolicy:
        return cls("latest", num_versions=max(num_versions, 1))  # TF Serving treats 0 as 1

    @classmethod
    def all(cls) -> VersionPolicy:
        return cls("all")

    @classmethod
    def specific(cls, versions: Iterable[int]) -> VersionPolicy:
        return cls("specific", versions=tuple(sorted(set(versions))))

    def select(self, found: Iterable[int]) -> set[int]:
        """The versions to serve out of the ones `found` on disk."""
        found = sorted(set(found))
        if self.kind == "all":
            return set(found)
        if self.kind == "specific":
            return set(found) & set(self.versions)
        return set(found[-self.num_versions:]) if found else set()

    def __str__(self) -> str:
        if self.kind == "latest":
            return f"latest {self.num_versions}"
        if self.kind == "specific":
            return "specific " + ", ".join(map(str, self.versions))
        return "all"


@dataclass(frozen=True)
class ModelConfig:
    """One `config { ... }` entry of a ModelServerConfig."""

    name: str
    base_path: str
    policy: VersionPolicy = field(default_factory=VersionPolicy.latest)
    labels: dict[str, int] = field(default_factory=dict)


def parse_model_server_config(
    config: str | bytes | object, *, source: str = "model config"
) -> list[ModelConfig]:
    """A ModelServerConfig (text proto, or the proto message itself) → its model entries, validated.

    `source` names the file (or request) in error messages. Relative base paths are taken
    relative to the current directory, as TF Serving does.
    """
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    if isinstance(config, (str, bytes)):
        text = config.decode("utf-8") if isinstance(config, bytes) else config
        proto = model_server_config_pb2.ModelServerConfig()
        try:
            text_format.Parse(text, proto)
        except text_format.ParseError as exc:
            # TF Serving's own words first: its users and tests look for them
            raise InvalidArgument(
                f"Error parsing text-format tensorflow.serving.ModelServerConfig: {exc} ({source}); the expected shape is "
                f"model_config_list {{ config {{ name: '...' base_path: '...' }} }} (see {CONFIG_DOCS})"
            ) from None
    else:
        proto = config
    kind = proto.WhichOneof("config")
    if kind == "custom_model_config":
        raise InvalidArgument(
            f"{source} uses custom_model_config, which tfservo does not support; use model_config_list"
        )
    entries = [_entry(c, source) for c in proto.model_config_list.config]
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise InvalidArgument(f"{source} names model {entry.name} twice; give each config a unique name")
        seen.add(entry.name)
    return entries


def single_model_config(name: str, base_path: str) -> ModelConfig:
    """TF Serving's --model_name/--model_base_path as the one config entry it stands for."""
    from tensorflow_serving.config import model_server_config_pb2

    proto = model_server_config_pb2.ModelServerConfig()
    proto.model_config_list.config.add(name=name, base_path=base_path, model_platform="tensorflow")
    return parse_model_server_config(proto, source="--model_name/--model_base_path")[0]


def read_model_config_file(path: str) -> list[ModelConfig]:
    """Read and parse a model config file; errors name the file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise InvalidArgument(
            f"cannot read model config file {path}: {exc.strerror}; check --model-config-file"
        ) from None
    return parse_model_server_config(text, source=f"model config file {path}")


def _entry(config: Any, source: str) -> ModelConfig:
    name = config.name
    if not name or not is_model_name(name):
        raise InvalidArgument(
            f"{source}: model name {name!r} is not valid; use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    if config.model_platform not in ("", "tensorflow"):
        raise InvalidArgument(
            f"{source}: model {name} has model_platform {config.model_platform!r}; "
            "only 'tensorflow' SavedModels can be served"
        )
    base_path = config.base_path
    if not base_path:
        raise InvalidArgument(
            f"{source}: model {name} has no base_path; set it to the dir holding its version dirs"
        )
    if "://" in base_path:
        scheme = base_path.split("://", 1)[0].lower()
        if scheme not in ("file", "local"):
            raise InvalidArgument(
                f"{source}: model {name} has base_path {base_path}; config-file models must be on "
                "local disk (download them first, or serve the URL as a bundle: tfservo serve URL)"
            )
        base_path = base_path.split("://", 1)[1]
    policy = _policy(config, name, source)
    labels = dict(config.version_labels)
    for label in labels:
        if not label:
            raise InvalidArgument(f"{source}: model {name} has an empty version label; name it")
    return ModelConfig(name, os.path.abspath(base_path), policy, labels)


def _policy(config: Any, name: str, source: str) -> VersionPolicy:
    choice = config.model_version_policy.WhichOneof("policy_choice")
    if choice is None:
        return VersionPolicy.latest(1)  # TF Serving's default
    if choice == "all":
        return VersionPolicy.all()
    if choice == "latest":
        return VersionPolicy.latest(config.model_version_policy.latest.num_versions)
    versions = list(config.model_version_policy.specific.versions)
    if not versions:
        raise InvalidArgument(
            f"{source}: model {name} has model_version_policy specific {{}} with no versions; "
            "list them: specific { versions: 1 versions: 2 }"
        )
    return VersionPolicy.specific(versions)
