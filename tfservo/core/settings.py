"""The one resolution of settings for every mode: flags, then the environment, then defaults.

`serve`, `invoke`, `inspect`, `transform` (every engine) and the pipeline adapters all call
`resolve_settings` and hand the result to the one service factory
(`tfservo.core.service.build_service`), so a variable such as
`SAGEMAKER_TFS_DEFAULT_MODEL_NAME` means the same thing whatever front door is used. Nothing
else in tfservo reads SAGEMAKER_* or TFSERVO_* variables. A bad value raises ConfigError
naming the flag or variable; the CLI turns it into a message and an exit status.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tfservo.core.errors import InvalidArgument
from tfservo.models.batching.options import BatchingOptions
from tfservo.models.bundle import ArchiveLimits

__all__ = [
    "DEFAULT_MODEL_ENV",
    "ConfigError",
    "Settings",
    "archive_limits_from_env",
    "execution_parameters_from_env",
    "parse_version_labels",
    "resolve_batching",
    "resolve_settings",
]

DEFAULT_MODEL_ENV = "SAGEMAKER_TFS_DEFAULT_MODEL_NAME"
MEMORY_FACTOR_ENV = "TFSERVO_MME_MEMORY_FACTOR"
DEFAULT_MODEL_PATH = "/opt/ml/model"
DEFAULT_MODEL_ROOT = "/opt/ml/models"
# Resident memory a loaded SavedModel takes per byte on disk (docs/decisions.md); 0 turns the
# multi-model memory check off.
DEFAULT_MEMORY_FACTOR = 2.0


class ConfigError(InvalidArgument):
    """A flag or environment variable whose value cannot work; the message names it."""


@dataclass(frozen=True)
class Settings:
    """Everything that decides how a bundle is loaded and served, resolved once."""

    paths: tuple[str, ...] = ()
    # which model answers a request that names none; None: the first model by name
    default_model_name: str | None = None
    version_labels: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    batching: BatchingOptions | None = None
    multi_model: bool = False  # SageMaker multi-model mode: no default model, /ping = "up"
    model_root: str = DEFAULT_MODEL_ROOT
    memory_factor: float = DEFAULT_MEMORY_FACTOR
    mme_memory_mb: float = 0.0  # target models' estimated memory bound; 0: the machine's memory only
    model_config_file: str | None = None
    file_system_poll_wait_seconds: float = 0.0
    requirements_dir: str | None = None  # where code/requirements.txt installs go
    archive_limits: ArchiveLimits = field(default_factory=ArchiveLimits)  # model.tar.gz extraction bounds
    reload_code: bool = False  # serve --reload: import changed handler code again
    # the serving front door (HTTP and gRPC listeners, worker processes)
    host: str = "127.0.0.1"
    port: int = 8080
    grpc_port: int | None = 9000
    max_request_mb: float = 100.0
    workers: int = 1
    log_level: str = "info"
    keep_alive_timeout: float = 5.0  # idle keep-alive connections close after this
    header_timeout: float = 10.0  # a request's headers must arrive within this
    max_connections: int = 0  # open connections per worker; 0: from the file limit
    max_decoding_mb: float = 0.0  # request bodies being decoded at once per worker; 0: from memory
    execution_parameters: Mapping[str, object] = field(default_factory=dict)
    # SageMaker's runtime API (/endpoints/NAME/invocations): the endpoint this server is (None:
    # answer to any name) and its production variant
    endpoint_name: str | None = None
    variant_name: str = "AllTraffic"
    # time limits (0: none): TF Serving REST calls (--rest_api_timeout_in_ms), invocations
    # (SAGEMAKER_GUNICORN_TIMEOUT_SECONDS); gRPC calls use the client's deadline
    request_timeout: float = 0.0
    invocation_timeout: float = 0.0
    warmup: bool = True  # replay assets.extra/tf_serving_warmup_requests (--enable_model_warmup)
    model_config_poll_seconds: float = 0.0  # re-read --model-config-file this often (0: never)
    monitoring_config_file: str | None = None  # TF Serving's MonitoringConfig: its metric names at its path
    grpc_host: str | None = None  # None: the HTTP host
    ssl_config_file: str | None = None  # TF Serving's SSLConfig for gRPC
    tls_cert: str | None = None  # HTTPS for the HTTP port
    tls_key: str | None = None
    tls_ca: str | None = None  # with it, clients must present a certificate it signed

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 2**20)

    @property
    def max_decoding_bytes(self) -> int | None:
        """--max-decoding-mb in bytes; None: the front door derives it from the memory available."""
        return int(self.max_decoding_mb * 2**20) if self.max_decoding_mb > 0 else None

    def replace(self, **changes: object) -> Settings:
        """A copy with some fields changed (e.g. a loopback server's host and ports)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def resolve_settings(
    *,
    paths: Sequence[str] = (),
    host: str | None = None,
    port: int | None = None,
    grpc_port: int | None = None,
    max_request_mb: float | None = None,
    version_labels: Sequence[str] = (),
    intra_op_threads: int | None = None,
    inter_op_threads: int | None = None,
    log_level: str | None = None,
    enable_batching: bool = False,
    batching_parameters_file: str | None = None,
    batching_eager: bool = False,
    workers: int | None = None,
    multi_model: bool | None = None,
    model_root: str | None = None,
    model_config_file: str | None = None,
    file_system_poll_wait_seconds: float | None = None,
    default_model_name: str | None = None,
    reload_code: bool = False,
    keep_alive_timeout: float | None = None,
    header_timeout: float | None = None,
    max_connections: int | None = None,
    max_decoding_mb: float | None = None,
    endpoint_name: str | None = None,
    variant_name: str | None = None,
    request_timeout: float | None = None,
    invocation_timeout: float | None = None,
    warmup: bool = True,
    model_config_poll_seconds: float | None = None,
    monitoring_config_file: str | None = None,
    grpc_host: str | None = None,
    ssl_config_file: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
    serve_default_path: bool = True,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Merge flags (None: not given) over SAGEMAKER_* / TFSERVO_* variables over defaults.

    `multi_model=None` reads SAGEMAKER_MULTI_MODEL (serve); callers that always bring a
    bundle (invoke, transform, pipelines) pass False. With no PATH, `serve_default_path`
    serves /opt/ml/model as the SageMaker container does.
    """
    env = os.environ if env is None else env
    workers = workers if workers is not None else _env_int(env, "SAGEMAKER_GUNICORN_WORKERS", 1)
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    if multi_model is None:
        multi_model = _env_bool(env, "SAGEMAKER_MULTI_MODEL", False)
    if multi_model and paths:
        raise ConfigError(
            f"multi-model mode starts with no models, but PATH {paths[0]} was given; "
            "drop PATH and load models with POST /models, or drop --multi-model / SAGEMAKER_MULTI_MODEL"
        )
    if multi_model and workers > 1:
        raise ConfigError(
            "multi-model mode needs one worker (models are loaded into one process); "
            "drop --workers / SAGEMAKER_GUNICORN_WORKERS"
        )
    poll = file_system_poll_wait_seconds or 0.0
    if poll < 0:
        raise ConfigError(f"--file-system-poll-wait-seconds must be 0 (off) or more, got {poll:g}")
    if not paths and serve_default_path and not multi_model and not model_config_file:
        paths = [DEFAULT_MODEL_PATH]
    in_sagemaker = "SAGEMAKER_BIND_TO_PORT" in env
    default_model = default_model_name or env.get(DEFAULT_MODEL_ENV) or None
    return Settings(
        paths=tuple(paths),
        default_model_name=None if default_model == "None" else default_model,  # the container's "unset"
        version_labels=parse_version_labels(version_labels),
        intra_op_threads=_flag_or_env(intra_op_threads, env, "SAGEMAKER_TFS_INTRA_OP_PARALLELISM", 0),
        inter_op_threads=_flag_or_env(inter_op_threads, env, "SAGEMAKER_TFS_INTER_OP_PARALLELISM", 0),
        batching=resolve_batching(enable_batching, batching_parameters_file, env, batching_eager),
        multi_model=multi_model,
        model_root=model_root or DEFAULT_MODEL_ROOT,
        memory_factor=_env_float(env, MEMORY_FACTOR_ENV, DEFAULT_MEMORY_FACTOR, "0 turns the memory check off"),
        model_config_file=model_config_file,
        file_system_poll_wait_seconds=poll,
        host=host or ("0.0.0.0" if in_sagemaker else "127.0.0.1"),
        port=_flag_or_env(port, env, "SAGEMAKER_BIND_TO_PORT", 8080),
        grpc_port=grpc_port if grpc_port is not None else _env_int(env, "TFSERVO_GRPC_PORT", 9000),
        max_request_mb=max_request_mb if max_request_mb is not None else _default_max_request_mb(env),
        workers=workers,
        log_level=log_level or env.get("TFSERVO_LOG_LEVEL", "info"),
        execution_parameters=execution_parameters_from_env(env),
        reload_code=reload_code,
        keep_alive_timeout=_positive("--keep-alive-timeout", keep_alive_timeout, 5.0),
        header_timeout=_positive("--header-timeout", header_timeout, 10.0),
        max_connections=int(_positive("--max-connections", max_connections, 0, allow_zero=True)),
        max_decoding_mb=_positive("--max-decoding-mb", max_decoding_mb, 0.0, allow_zero=True),
        requirements_dir=env.get("TFSERVO_REQUIREMENTS_DIR") or None,
        archive_limits=archive_limits_from_env(env),
        mme_memory_mb=_env_float(env, "TFSERVO_MME_MEMORY_MB", 0.0, "0 or unset: the machine's memory only"),
        endpoint_name=endpoint_name or env.get("TFSERVO_ENDPOINT_NAME") or None,
        variant_name=variant_name or env.get("TFSERVO_VARIANT_NAME") or "AllTraffic",
        request_timeout=_positive("--request-timeout", request_timeout, 0.0, allow_zero=True),
        invocation_timeout=(
            _positive("--invocation-timeout", invocation_timeout, 0.0, allow_zero=True)
            if invocation_timeout is not None
            else _env_float(env, "SAGEMAKER_GUNICORN_TIMEOUT_SECONDS", 0.0, "seconds; 0 or unset: no limit")
        ),
        warmup=warmup,
        model_config_poll_seconds=_positive(
            "--model-config-file-poll-wait-seconds", model_config_poll_seconds, 0.0, allow_zero=True
        ),
        monitoring_config_file=monitoring_config_file,
        grpc_host=grpc_host,
        ssl_config_file=ssl_config_file,
        **_tls(tls_cert, tls_key, tls_ca),
    )


def _tls(cert: str | None, key: str | None, ca: str | None) -> dict[str, str | None]:
    """--tls-cert and --tls-key come together; --tls-ca needs them."""
    if bool(cert) != bool(key):
        raise ConfigError("HTTPS needs both --tls-cert FILE and --tls-key FILE")
    if ca and not cert:
        raise ConfigError("--tls-ca (client certificates) needs --tls-cert and --tls-key")
    return {"tls_cert": cert, "tls_key": key, "tls_ca": ca}


def archive_limits_from_env(env: Mapping[str, str]) -> ArchiveLimits:
    """TFSERVO_ARCHIVE_MAX_FILES, TFSERVO_ARCHIVE_MAX_GB and TFSERVO_ARCHIVE_MAX_RATIO."""
    default = ArchiveLimits()
    max_gb = _env_float(env, "TFSERVO_ARCHIVE_MAX_GB", 0.0, "0 or unset: the free disk space")
    limits = ArchiveLimits(
        max_files=_env_int(env, "TFSERVO_ARCHIVE_MAX_FILES", default.max_files),
        max_bytes=int(max_gb * 2**30) if max_gb > 0 else None,
        max_ratio=_env_float(env, "TFSERVO_ARCHIVE_MAX_RATIO", default.max_ratio, "extracted bytes per compressed byte"),
    )
    if limits.max_files <= 0 or limits.max_ratio <= 0:
        raise ConfigError("TFSERVO_ARCHIVE_MAX_FILES and TFSERVO_ARCHIVE_MAX_RATIO must be positive")
    return limits


def resolve_batching(
    enable: bool, parameters_file: str | None, env: Mapping[str, str], eager: bool = False
) -> BatchingOptions | None:
    """--enable-batching [--batching-parameters-file] or SAGEMAKER_TFS_ENABLE_BATCHING and friends.

    --batching-eager / TFSERVO_BATCHING_EAGER closes a batch as soon as a batch thread is free
    instead of waiting for the timeout (a lone request runs at once; batches form under load).
    """
    eager = eager or _env_bool(env, "TFSERVO_BATCHING_EAGER", False)
    options: BatchingOptions | None
    try:
        if parameters_file:
            options = BatchingOptions.from_parameters_file(parameters_file)
        elif enable:
            options = BatchingOptions.from_env({**env, "SAGEMAKER_TFS_ENABLE_BATCHING": "true"})
        else:
            options = BatchingOptions.from_env(env)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"batching settings: {exc}") from None
    return dataclasses.replace(options, eager=True) if options is not None and eager else options


def execution_parameters_from_env(env: Mapping[str, str]) -> dict[str, object]:
    """GET /execution-parameters: what SageMaker batch transform asks a container for.

    SageMaker sets SAGEMAKER_BATCH_STRATEGY as MULTI_RECORD / SINGLE_RECORD; the endpoint
    answers the API's spelling (MultiRecord / SingleRecord).
    """
    raw = env.get("SAGEMAKER_BATCH_STRATEGY") or "MultiRecord"
    strategy = _BATCH_STRATEGIES.get(raw.replace("_", "").replace("-", "").lower())
    if strategy is None:
        raise ConfigError(
            f"environment variable SAGEMAKER_BATCH_STRATEGY={raw!r} must be "
            "MultiRecord (MULTI_RECORD) or SingleRecord (SINGLE_RECORD)"
        )
    return {
        "MaxConcurrentTransforms": _env_int(env, "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", os.cpu_count() or 1),
        "BatchStrategy": strategy,
        "MaxPayloadInMB": _env_int(env, "SAGEMAKER_MAX_PAYLOAD_IN_MB", 6),
    }


def parse_version_labels(specs: Sequence[str]) -> dict[str, dict[str, int]]:
    """`MODEL:LABEL=VERSION` flags → {model: {label: version}}."""
    labels: dict[str, dict[str, int]] = {}
    for spec in specs:
        model, sep, rest = spec.partition(":")
        label, eq, version = rest.partition("=")
        if not (sep and eq and model and label and version.isdigit()):
            raise ConfigError(
                f"--version-label {spec!r} is not MODEL:LABEL=VERSION (e.g. half_plus_two:stable=123)"
            )
        labels.setdefault(model, {})[label] = int(version)
    return labels


_BATCH_STRATEGIES = {"multirecord": "MultiRecord", "singlerecord": "SingleRecord"}
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} must be an integer") from None


def _env_float(env: Mapping[str, str], name: str, default: float, note: str) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} must be a number ({note})") from None


def _env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(f"environment variable {name}={raw!r} must be 'true' or 'false'")


def _positive(flag: str, value: float | None, default: float, *, allow_zero: bool = False) -> float:
    if value is None:
        return default
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{flag} must be more than 0, got {value:g}")
    return value


def _flag_or_env(flag: int | None, env: Mapping[str, str], name: str, default: int) -> int:
    return flag if flag is not None else _env_int(env, name, default)


def _default_max_request_mb(env: Mapping[str, str]) -> float:
    """100 MB; in a SageMaker batch job (SAGEMAKER_BATCH=true) at least the payload it will send."""
    if env.get("SAGEMAKER_BATCH", "").lower() == "true":
        return float(max(100, _env_int(env, "SAGEMAKER_MAX_PAYLOAD_IN_MB", 6)))
    return 100.0
