"""Running a transform job in this process: --env applied, the model loaded once through the
service factory, handler endpoints when the bundle has handlers (so `context.rest_uri` and
`context.channel` answer), then the local engine."""

from __future__ import annotations

import os

from tfservo.batch.engines.local import TransformEngine, list_job_inputs
from tfservo.batch.job import JobError, TransformJob
from tfservo.batch.sinks import OutputStore
from tfservo.batch.state import TransformSummary, bundle_versions, check_settings, job_description
from tfservo.core.service import ModelService, build_service
from tfservo.core.settings import ConfigError, environment, resolve_settings
from tfservo.server.loopback import start_handler_endpoints

__all__ = ["apply_env", "load_service", "run_transform"]


_APPLIED: dict[str, str | None] = {}  # keys an earlier apply_env set → their values before it


def apply_env(env: dict[str, str]) -> None:
    """--env KEY=VALUE into this process's environment, as SageMaker's Environment is, for what
    reads it there: handler code, and the storage and AWS libraries (credentials, endpoints).
    The job's keys replace an earlier job's: a worker process reused by a later job (Spark
    reuses its Python workers) first gets back what the earlier --env changed. tfservo's own
    settings never come from here: load_service resolves them from the job's env."""
    for key, before in list(_APPLIED.items()):
        if key not in env:
            if before is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = before
            del _APPLIED[key]
    for key, value in env.items():
        _APPLIED.setdefault(key, os.environ.get(key))
        os.environ[key] = value


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


def run_transform(
    job: TransformJob,
    *,
    service: ModelService | None = None,
    progress: str = "auto",
    progress_interval: float = 10.0,
) -> TransformSummary:
    """Run `job` to the end in this process; pass `service` to reuse an already loaded model."""
    job = job.validated()
    # before loading the model: a wrong path or changed flags fail in a second
    objects = list_job_inputs(job)
    check_settings(OutputStore(job.state_url), job, job_description(job))
    own = service is None
    if service is None:
        apply_env(job.env)
        service = load_service(job.model, job.env)
    loopback = start_handler_endpoints(service)
    try:
        engine = TransformEngine(
            job, service.invoker, progress=progress, progress_interval=progress_interval,
            versions=bundle_versions(service.bundles),
        )
        return engine.run(objects)
    finally:
        if loopback is not None:
            loopback.stop()
        if own:
            service.close()
