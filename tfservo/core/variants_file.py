"""`serve --variants FILE`: the production variants and shadow variants of one endpoint, as
SageMaker's CreateEndpointConfig declares them, in a TOML, YAML or JSON file.

```toml
[[variants]]
name = "A"                  # VariantName
model = "a/model.tar.gz"    # relative to this file; or: models = ["pre.tar.gz", "model.tar.gz"], pipeline = "serial"
weight = 0.8                # InitialVariantWeight
instances = 1               # InitialInstanceCount (reported; every variant shares the server's workers)
version_label = "stable"    # TF Serving's label: the version a request naming none gets
environment = { SAGEMAKER_TFS_DEFAULT_MODEL_NAME = "half_plus_two" }

[[shadow_variants]]
name = "S"
model = "b/model.tar.gz"
weight = 0.8                # copies of production traffic: weight / the production weights' sum
```

The SageMaker SDK session writes this file from CreateEndpointConfig, so both say the same.
Every key is checked before anything loads; a mistake names the file, the variant and the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfservo.core.config_file import parse_document
from tfservo.core.pipeline_file import relative_to
from tfservo.core.settings import ConfigError

__all__ = ["EndpointSpec", "VariantSpec", "read_variants_file"]

_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")  # SageMaker's VariantName
_KEYS = {"name", "model", "models", "weight", "instances", "pipeline", "container_hostnames", "version_label",
         "environment"}
_MAX_VARIANTS = 10  # SageMaker's limit of production variants per endpoint
_MAX_SHADOWS = 1  # and of shadow variants


@dataclass(frozen=True)
class VariantSpec:
    """One variant: its bundle (or a pipeline of bundles), weight and settings."""

    name: str
    paths: tuple[str, ...]
    weight: float = 1.0
    instances: int = 1
    pipeline: str | None = None  # None: one bundle; "serial" or "direct": the paths are its containers
    container_hostnames: tuple[str, ...] = ()
    version_label: str | None = None
    environment: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EndpointSpec:
    """What a variants file declares."""

    path: str
    variants: tuple[VariantSpec, ...]
    shadows: tuple[VariantSpec, ...] = ()

    def names(self) -> list[str]:
        return [v.name for v in (*self.variants, *self.shadows)]


def read_variants_file(path: str) -> EndpointSpec:
    """The variants file at `path`, checked (ConfigError naming the file and key)."""
    doc = parse_document(path, "--variants")
    unknown = sorted(set(doc) - {"variants", "shadow_variants"})
    if unknown:
        raise ConfigError(f"--variants {path}: unknown key {unknown[0]!r}; a variants file holds [[variants]] "
                          "and [[shadow_variants]] tables")
    variants = tuple(_variant(path, "variants", i, v) for i, v in enumerate(_tables(path, doc, "variants")))
    shadows = tuple(_variant(path, "shadow_variants", i, v) for i, v in enumerate(_tables(path, doc, "shadow_variants")))
    if not variants:
        raise ConfigError(f"--variants {path}: no [[variants]]; declare at least one production variant")
    if len(variants) > _MAX_VARIANTS or len(shadows) > _MAX_SHADOWS:
        raise ConfigError(f"--variants {path}: at most {_MAX_VARIANTS} production variants and {_MAX_SHADOWS} "
                          f"shadow variant (SageMaker's limits), got {len(variants)} and {len(shadows)}")
    names = [v.name for v in (*variants, *shadows)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"--variants {path}: variant {twice[0]} is declared twice; names must be unique")
    if sum(v.weight for v in variants) <= 0:
        raise ConfigError(f"--variants {path}: every production variant has weight 0; give one a weight above 0")
    return EndpointSpec(path, variants, shadows)


def _tables(path: str, doc: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"--variants {path}: {key} is a list of tables ([[{key}]]), not {type(value).__name__}")
    return value


def _variant(path: str, key: str, index: int, table: Mapping[str, Any]) -> VariantSpec:
    where = f"--variants {path}: {key}[{index}]"
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(sorted(_KEYS))}")
    name = table.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{where}: name {name!r} must be 1 to 63 letters, digits and hyphens (SageMaker's VariantName)")
    where = f"--variants {path}: variant {name}"
    models = table.get("models", table.get("model"))
    if "model" in table and "models" in table:
        raise ConfigError(f"{where}: give model (one bundle) or models (a pipeline's), not both")
    paths = [models] if isinstance(models, str) else models
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
        raise ConfigError(f"{where}: model is the bundle's path (or models, a list of paths for a pipeline)")
    pipeline = table.get("pipeline")
    if pipeline is True:
        pipeline = "serial"
    if pipeline in (False, None):
        pipeline = None
    elif not isinstance(pipeline, str) or pipeline.lower() not in ("serial", "direct"):
        raise ConfigError(f"{where}: pipeline is \"serial\" or \"direct\", not {pipeline!r}")
    else:
        pipeline = pipeline.lower()
    if len(paths) > 1 and pipeline is None:
        raise ConfigError(f"{where}: {len(paths)} models need pipeline = \"serial\" (or \"direct\")")
    weight = table.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
        raise ConfigError(f"{where}: weight must be a number of at least 0, not {weight!r}")
    instances = table.get("instances", 1)
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise ConfigError(f"{where}: instances must be a whole number of at least 1, not {instances!r}")
    hostnames = table.get("container_hostnames", [])
    if not isinstance(hostnames, list) or not all(isinstance(h, str) and h for h in hostnames) or (
            hostnames and len(hostnames) != len(paths)):
        raise ConfigError(f"{where}: container_hostnames is a list of one name per model")
    label = table.get("version_label")
    if label is not None and (not isinstance(label, str) or not label):
        raise ConfigError(f"{where}: version_label is a label's name, such as \"stable\"")
    environment = table.get("environment", {})
    if not isinstance(environment, dict):
        raise ConfigError(f"{where}: environment is a table of variables")
    return VariantSpec(name, tuple(relative_to(path, p) for p in paths), float(weight), instances, pipeline,
                       tuple(hostnames), label,
                       {str(k): str(v) for k, v in environment.items()})
