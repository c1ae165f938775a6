"""`serve --config FILE`: settings written in a file (TOML, YAML or JSON), by the names of their
flags (`workers = 2`, `intra-op-threads = 1`, `batching = "timeout"`) or of their environment
variables (`SAGEMAKER_TFS_MAX_BATCH_SIZE = 16`, for settings that have no flag), and `paths`.

A flag on the command line wins over the file, and the file over the environment: the file is
what `tfservo tune` writes and what a deployment names, so what it says holds unless the command
line says otherwise. Every key is checked against the declared settings (tfservo.core.settings)
before anything starts: an unknown key, or a value of the wrong type, names the file and the key.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from tfservo.core.batching_options import BATCHING_VARIABLES
from tfservo.core.settings import ConfigError, Option, options

__all__ = ["ConfigFile", "parse_document", "read_config_file"]


@dataclass(frozen=True)
class ConfigFile:
    """What a config file says: flag values by setting name, variables, and the paths to serve."""

    path: str
    flags: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    paths: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)  # keys of `extra` (a door's own flags), as text


def read_config_file(path: str, extra: Collection[str] = ()) -> ConfigFile:
    """The config file at `path`, each key checked against the declared settings (ConfigError);
    keys in `extra` (tensorflow_model_server's own flag names) are kept apart, as text."""
    doc = parse_document(path)
    by_key: dict[str, Option] = {}
    variables: set[str] = set(BATCHING_VARIABLES)
    for option in options():
        variables.update(option.env)
        if option.flags:
            by_key[option.name] = option
            for flag in option.flags:
                by_key[flag.lstrip("-").replace("-", "_")] = option
    flags: dict[str, Any] = {}
    env: dict[str, str] = {}
    paths: tuple[str, ...] = ()
    given_extra: dict[str, str] = {}
    for key, value in doc.items():
        if key in extra:
            given_extra[key] = _variable(path, key, value)
        elif key in ("paths", "path"):
            paths = tuple(_strings(path, key, value))
        elif key in variables:
            env[key] = _variable(path, key, value)
        elif key.replace("-", "_") in by_key:
            option = by_key[key.replace("-", "_")]
            typed = _typed(path, key, option, value)
            if typed is False and option.env:  # a flag cannot say off; its variable can, over the environment's
                env[option.env[0]] = "false"
            elif typed is not False:
                flags[option.name] = typed
        else:
            known = sorted({*(f.lstrip("-") for o in by_key.values() for f in o.flags), *variables, "paths"})
            close = difflib.get_close_matches(key, known, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; keys are serve's flags without the dashes"
            raise ConfigError(f"{path}: unknown setting {key!r}{hint} (or their environment variables)")
    return ConfigFile(path, flags, env, paths, given_extra)


def parse_document(path: str, flag: str = "--config") -> dict[str, Any]:
    """The table a TOML, YAML or JSON file holds; ConfigError naming `flag` and the file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: {exc.strerror}") from None
    suffix = os.path.splitext(path)[1].lower()
    try:
        if suffix == ".toml":
            import tomllib

            doc: Any = tomllib.loads(data.decode())
        elif suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise ConfigError(f"{path}: reading YAML needs PyYAML (pip install pyyaml); "
                                      "or write the file as TOML") from None
            doc = yaml.safe_load(data)
        elif suffix == ".json":
            doc = json.loads(data)
        else:
            raise ConfigError(f"{path}: a config file ends in .toml, .yaml, .yml or .json")
    except ConfigError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{path} does not parse: {first}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: the file holds a table of settings (key = value), not a {type(doc).__name__}")
    return doc


def _typed(path: str, key: str, option: Option, value: Any) -> Any:
    kind = option.kind
    if option.multiple:
        return tuple(_strings(path, key, value))
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: {key} is true or false, got {value!r}")
        return value
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{path}: {key} is a whole number, got {value!r}")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: {key} is a number, got {value!r}")
        return float(value)
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"{path}: {key} is a string, got {value!r}")
    return value


def _variable(path: str, key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ConfigError(f"{path}: {key} is a string, number or true/false, got {value!r}")


def _strings(path: str, key: str, value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise ConfigError(f"{path}: {key} is a string or a list of strings, got {value!r}")
    return items
