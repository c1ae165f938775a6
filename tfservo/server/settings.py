"""Server settings from flags and SageMaker's environment variables (flags win)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from tfservo.batching.options import BatchingOptions


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"tfservo: environment variable {name}={raw!r} must be an integer") from None


@dataclass
class ServerSettings:
    """Everything `tfservo serve` needs to start."""

    paths: list[str] = field(default_factory=lambda: ["/opt/ml/model"])
    host: str = "127.0.0.1"
    port: int = 8080
    grpc_port: int | None = 9000
    max_request_mb: float = 100.0
    version_labels: list[str] = field(default_factory=list)
    default_model_name: str | None = None
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    log_level: str = "info"
    execution_parameters: dict[str, object] = field(default_factory=dict)
    batching: BatchingOptions | None = None
    workers: int = 1
    multi_model: bool = False
    model_root: str = "/opt/ml/models"
    model_config_file: str | None = None
    file_system_poll_wait_seconds: float = 0.0

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 2**20)


def resolve_settings(
    *,
    paths: tuple[str, ...] | list[str],
    host: str | None,
    port: int | None,
    grpc_port: int | None,
    max_request_mb: float | None,
    version_labels: tuple[str, ...] | list[str],
    intra_op_threads: int | None,
    inter_op_threads: int | None,
    log_level: str | None,
    enable_batching: bool = False,
    batching_parameters_file: str | None = None,
    batching_eager: bool = False,
    workers: int | None = None,
    multi_model: bool = False,
    model_root: str | None = None,
    model_config_file: str | None = None,
    file_system_poll_wait_seconds: float | None = None,
    env: Mapping[str, str] | None = None,
) -> ServerSettings:
    """Merge flags over SAGEMAKER_* variables over defaults."""
    env = os.environ if env is None else env
    workers = workers if workers is not None else _env_int(env, "SAGEMAKER_GUNICORN_WORKERS", 1)
    if workers < 1:
        raise SystemExit(f"tfservo: --workers must be at least 1, got {workers}")
    multi_model = multi_model or env.get("SAGEMAKER_MULTI_MODEL", "").lower() == "true"
    if multi_model and paths:
        raise SystemExit(
            f"tfservo: multi-model mode starts with no models, but PATH {paths[0]} was given; "
            "drop PATH and load models with POST /models, or drop --multi-model / SAGEMAKER_MULTI_MODEL"
        )
    if multi_model and workers > 1:
        raise SystemExit(
            "tfservo: multi-model mode needs one worker (models are loaded into one process); "
            "drop --workers / SAGEMAKER_GUNICORN_WORKERS"
        )
    poll = file_system_poll_wait_seconds or 0.0
    if poll < 0:
        raise SystemExit(f"tfservo: --file-system-poll-wait-seconds must be 0 (off) or more, got {poll:g}")
    in_sagemaker = "SAGEMAKER_BIND_TO_PORT" in env
    return ServerSettings(
        paths=list(paths) or ([] if multi_model or model_config_file else ["/opt/ml/model"]),
        host=host or ("0.0.0.0" if in_sagemaker else "127.0.0.1"),
        port=port if port is not None else _env_int(env, "SAGEMAKER_BIND_TO_PORT", 8080),
        grpc_port=grpc_port if grpc_port is not None else _env_int(env, "TFSERVO_GRPC_PORT", 9000),
        max_request_mb=max_request_mb if max_request_mb is not None else _default_max_request_mb(env),
        version_labels=list(version_labels),
        default_model_name=env.get("SAGEMAKER_TFS_DEFAULT_MODEL_NAME") or None,
        intra_op_threads=intra_op_threads
        if intra_op_threads is not None
        else _env_int(env, "SAGEMAKER_TFS_INTRA_OP_PARALLELISM", 0),
        inter_op_threads=inter_op_threads
        if inter_op_threads is not None
        else _env_int(env, "SAGEMAKER_TFS_INTER_OP_PARALLELISM", 0),
        log_level=log_level or env.get("TFSERVO_LOG_LEVEL", "info"),
        execution_parameters=execution_parameters_from_env(env),
        batching=resolve_batching(enable_batching, batching_parameters_file, env, batching_eager),
        workers=workers,
        multi_model=multi_model,
        model_root=model_root or "/opt/ml/models",
        model_config_file=model_config_file,
        file_system_poll_wait_seconds=poll,
    )


def resolve_batching(
    enable: bool, parameters_file: str | None, env: Mapping[str, str], eager: bool = False
) -> BatchingOptions | None:
    """--enable-batching [--batching-parameters-file] or SAGEMAKER_TFS_ENABLE_BATCHING and friends.

    --batching-eager / TFSERVO_BATCHING_EAGER closes a batch as soon as a batch thread is free
    instead of waiting for the timeout (a lone request runs at once; batches form under load).
    """
    raw_eager = env.get("TFSERVO_BATCHING_EAGER", "").strip().lower()
    if raw_eager not in ("", "true", "false", "1", "0"):
        raise SystemExit(f"tfservo: environment variable TFSERVO_BATCHING_EAGER={raw_eager!r} must be 'true' or 'false'")
    eager = eager or raw_eager in ("true", "1")
    try:
        if parameters_file:
            options = BatchingOptions.from_parameters_file(parameters_file)
        elif enable:
            options = BatchingOptions.from_env({**env, "SAGEMAKER_TFS_ENABLE_BATCHING": "true"})
        else:
            options = BatchingOptions.from_env(env)
    except (ValueError, OSError) as exc:
        raise SystemExit(f"tfservo: batching settings: {exc}") from None
    return dataclasses.replace(options, eager=True) if options is not None and eager else options


def execution_parameters_from_env(env: Mapping[str, str]) -> dict[str, object]:
    """GET /execution-parameters: what SageMaker batch transform asks a container for.

    SageMaker sets SAGEMAKER_BATCH_STRATEGY as MULTI_RECORD / SINGLE_RECORD; the endpoint
    answers the API's spelling (MultiRecord / SingleRecord).
    """
    raw = env.get("SAGEMAKER_BATCH_STRATEGY") or "MultiRecord"
    strategy = _BATCH_STRATEGIES.get(raw.replace("_", "").replace("-", "").lower())
    if strategy is None:
        raise SystemExit(
            f"tfservo: environment variable SAGEMAKER_BATCH_STRATEGY={raw!r} must be "
            "MultiRecord (MULTI_RECORD) or SingleRecord (SINGLE_RECORD)"
        )
    return {
        "MaxConcurrentTransforms": _env_int(env, "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", os.cpu_count() or 1),
        "BatchStrategy": strategy,
        "MaxPayloadInMB": _env_int(env, "SAGEMAKER_MAX_PAYLOAD_IN_MB", 6),
    }


_BATCH_STRATEGIES = {"multirecord": "MultiRecord", "singlerecord": "SingleRecord"}


def _default_max_request_mb(env: Mapping[str, str]) -> float:
    """100 MB; in a SageMaker batch job (SAGEMAKER_BATCH=true) at least the payload it will send."""
    if env.get("SAGEMAKER_BATCH", "").lower() == "true":
        return float(max(100, _env_int(env, "SAGEMAKER_MAX_PAYLOAD_IN_MB", 6)))
    return 100.0
