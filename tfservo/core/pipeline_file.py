"""A pipeline file: a SageMaker inference pipeline's containers, in order, in a TOML, YAML or JSON
file that stands wherever a bundle's path does (`serve`, `invoke`, `transform` on every engine,
the Beam, Ray and Spark adapters), so a pipeline runs every way a bundle does.

```toml
mode = "serial"               # InferenceExecutionConfig's Mode: serial or direct
[[containers]]
hostname = "csv-to-json"      # ContainerHostname [default: container-1, ...]
model = "preprocess/"         # a bundle: dir, model.tar.gz or s3:// URL; relative to this file
[[containers]]
model = "model.tar.gz"
```

`resolve_settings` reads it (`paths` of one such file → the containers' paths, `pipeline` on),
so no door decides it again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tfservo.core.config_file import parse_document
from tfservo.core.settings import ConfigError

__all__ = ["PIPELINE_SUFFIXES", "PipelineSpec", "container_paths", "is_pipeline_file", "read_pipeline_file",
           "relative_to"]

PIPELINE_SUFFIXES = (".toml", ".yaml", ".yml", ".json")  # a bundle is never one of these


@dataclass(frozen=True)
class PipelineSpec:
    """The containers' bundles, their hostnames and the mode."""

    paths: tuple[str, ...]
    hostnames: tuple[str, ...]
    mode: str = "serial"


def is_pipeline_file(path: str) -> bool:
    """Whether `path` is a local pipeline file rather than a bundle."""
    local = path[len("file://"):] if path.startswith("file://") else path
    return "://" not in local and local.lower().endswith(PIPELINE_SUFFIXES) and os.path.isfile(local)


def relative_to(document: str, path: str) -> str:
    """A bundle path written in a file, relative to that file's folder (URLs and absolute paths as they are)."""
    if "://" in path or os.path.isabs(os.path.expanduser(path)):
        return os.path.expanduser(path)
    return os.path.join(os.path.dirname(os.path.abspath(document)), path)


def read_pipeline_file(path: str) -> PipelineSpec:
    """The pipeline file at `path`, checked (ConfigError naming the file and the key)."""
    local = path[len("file://"):] if path.startswith("file://") else path
    doc = parse_document(local, "pipeline file")
    unknown = sorted(set(doc) - {"mode", "containers"})
    if unknown:
        raise ConfigError(f"pipeline file {path}: unknown key {unknown[0]!r}; it holds mode and [[containers]]")
    mode = str(doc.get("mode", "serial")).lower()
    if mode not in ("serial", "direct"):
        raise ConfigError(f"pipeline file {path}: mode is \"serial\" or \"direct\", not {doc.get('mode')!r}")
    containers = doc.get("containers")
    if not isinstance(containers, list) or not containers or not all(isinstance(c, dict) for c in containers):
        raise ConfigError(f"pipeline file {path}: [[containers]] lists the pipeline's bundles, in order, each "
                          "with model = \"PATH\"")
    if len(containers) > 15:
        raise ConfigError(f"pipeline file {path}: at most 15 containers (SageMaker's limit), got {len(containers)}")
    paths, hostnames = [], []
    for i, container in enumerate(containers):
        extra = sorted(set(container) - {"model", "hostname"})
        model = container.get("model")
        if extra or not isinstance(model, str) or not model:
            raise ConfigError(f"pipeline file {path}: containers[{i}] has model = \"PATH\" and an optional hostname"
                              + (f", not {extra[0]!r}" if extra else ""))
        hostname = container.get("hostname", "")
        if not isinstance(hostname, str):
            raise ConfigError(f"pipeline file {path}: containers[{i}]'s hostname is a name")
        paths.append(relative_to(local, model))
        hostnames.append(hostname or f"container-{i + 1}")
    if len(set(hostnames)) != len(hostnames):
        raise ConfigError(f"pipeline file {path}: two containers are named {hostnames[0]}; hostnames must be unique")
    return PipelineSpec(tuple(paths), tuple(hostnames), mode)


def container_paths(path: str) -> list[str]:
    """The bundles behind a model path: a pipeline file's containers, else the path itself."""
    return list(read_pipeline_file(path).paths) if is_pipeline_file(path) else [path]
