"""TF Serving's small text-format configs that its pip package ships no protos for:
MonitoringConfig (--monitoring_config_file) and SSLConfig (--ssl_config_file).

Both are flat: `name: value` fields (MonitoringConfig's inside `prometheus_config { }`), values
quoted strings (C escapes; PEM text may span lines, as TF Serving's docs write it) or bare
words. Unknown fields are an error naming them, as protobuf's parser would.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from tfservo.core.settings import ConfigError

__all__ = ["MonitoringConfig", "SSLConfig", "read_monitoring_config", "read_ssl_config"]

DEFAULT_METRICS_PATH = "/monitoring/prometheus/metrics"

_FIELD = re.compile(r'\s*(\w+)\s*:\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|[\w./-]+)\s*[,;]?', re.S)


@dataclass(frozen=True)
class MonitoringConfig:
    enable: bool = False
    path: str = DEFAULT_METRICS_PATH


@dataclass(frozen=True)
class SSLConfig:
    server_key: str = ""
    server_cert: str = ""
    custom_ca: str = ""
    client_verify: bool = False


def _fields(text: str, where: str, allowed: set[str]) -> dict[str, str | bool]:
    text = re.sub(r"#[^\n]*", "", text)
    out: dict[str, str | bool] = {}
    pos = 0
    while pos < len(text.rstrip()):
        match = _FIELD.match(text, pos)
        if match is None:
            raise ConfigError(f"{where}: cannot read {text[pos:pos + 40].strip()!r}; write fields as name: \"value\"")
        name, raw = match[1], match[2]
        if name not in allowed:
            raise ConfigError(f"{where}: unknown field {name!r}; it has {', '.join(sorted(allowed))}")
        if raw[0] in "\"'":
            out[name] = codecs.decode(raw[1:-1].encode("latin-1", "backslashreplace"), "unicode_escape")
        elif raw in ("true", "false"):
            out[name] = raw == "true"
        else:
            out[name] = raw
        pos = match.end()
    return out


def _read(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {flag} {path}: {exc.strerror}") from None


def read_monitoring_config(path: str) -> MonitoringConfig:
    """`prometheus_config { enable: true, path: "/monitoring/prometheus/metrics" }`."""
    text = _read(path, "--monitoring_config_file")
    block = re.fullmatch(r"\s*prometheus_config\s*:?\s*\{(.*)\}\s*", re.sub(r"#[^\n]*", "", text), re.S)
    if block is None:
        raise ConfigError(
            f"--monitoring_config_file {path} is not a MonitoringConfig; write "
            'prometheus_config { enable: true, path: "/monitoring/prometheus/metrics" }'
        )
    fields = _fields(block[1], f"--monitoring_config_file {path}", {"enable", "path"})
    return MonitoringConfig(bool(fields.get("enable", False)), str(fields.get("path") or DEFAULT_METRICS_PATH))


def read_ssl_config(path: str) -> SSLConfig:
    """server_key, server_cert (PEM text), custom_ca, client_verify."""
    where = f"--ssl_config_file {path}"
    fields = _fields(_read(path, "--ssl_config_file"), where, {"server_key", "server_cert", "custom_ca", "client_verify"})
    config = SSLConfig(**fields)  # type: ignore[arg-type]
    if not config.server_key or not config.server_cert:
        raise ConfigError(f"{where} needs both server_key and server_cert (PEM text)")
    if config.client_verify and not config.custom_ca:
        raise ConfigError(f"{where}: client_verify needs custom_ca to check client certificates")
    return config
