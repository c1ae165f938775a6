"""A transform's model, loaded once per process: --env applied as SageMaker applies a job's
Environment, then the bundle through the one service factory with the settings `serve` would use."""

from __future__ import annotations

from tfservo.batch.job import JobError
from tfservo.core import environment as process_env
from tfservo.core.settings import ConfigError, environment, resolve_settings
from tfservo.service.factory import ModelService, build_service

__all__ = ["apply_env", "load_service"]


_APPLIED: dict[str, str | None] = {}  # keys an earlier apply_env set → their values before it


def apply_env(env: dict[str, str]) -> None:
    """--env KEY=VALUE into this process's environment, as SageMaker's Environment is, for what
    reads it there: handler code, and the storage and AWS libraries (credentials, endpoints).
    The job's keys replace an earlier job's: a worker process reused by a later job (Spark
    reuses its Python workers) first gets back what the earlier --env changed. tfservo's own
    settings never come from here: load_service resolves them from the job's env."""
    process_env.export({key: _APPLIED.pop(key) for key in list(_APPLIED) if key not in env})
    for key, before in process_env.export(env).items():
        _APPLIED.setdefault(key, before)


def load_service(model: str, env: dict[str, str] | None = None, *, cores: int | None = None) -> ModelService:
    """Load a bundle through the one service factory, with the settings `serve` would use and
    a job's `--env` over this process's environment; `cores`: the CPUs a cluster worker owns,
    its TensorFlow intra-op threads unless the environment sets them."""
    try:
        settings = resolve_settings(paths=[model], multi_model=False, serving=False, env=environment(env))
    except ConfigError as exc:
        raise JobError(exc.message) from None
    if cores and not settings.intra_op_threads:
        settings = settings.replace(intra_op_threads=cores)
    service = build_service(settings)
    if not service.is_healthy():
        problems = service.load_errors()
        service.close()
        raise JobError(f"{model} has a model with no loadable version: {'; '.join(problems) or 'none loaded'}")
    return service
