"""Running a transform job in this process: --env applied, the model loaded once through the
service factory, handler endpoints when the bundle has handlers (so `context.rest_uri` and
`context.channel` answer), then the local engine."""

from __future__ import annotations

from tfservo.batch.engines.local import TransformEngine, list_job_inputs
from tfservo.batch.job import TransformJob
from tfservo.batch.loading import apply_env, load_service
from tfservo.batch.sinks import OutputStore
from tfservo.batch.state import TransformSummary, bundle_versions, check_settings, job_description
from tfservo.server.loopback import start_handler_endpoints
from tfservo.service.factory import ModelService

__all__ = ["run_transform"]


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
