"""Running a transform job in this process: --env applied, the model loaded once, a loopback
server for handlers (so `context.rest_uri` and `context.channel` answer), then the local engine."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tfservo.sagemaker.service import ModelService
from tfservo.transform.engine import TransformEngine, list_job_inputs
from tfservo.transform.job import JobError, TransformJob
from tfservo.transform.sinks import OutputStore
from tfservo.transform.state import TransformSummary, bundle_versions, check_settings, job_description

if TYPE_CHECKING:
    from tfservo.server.run import LoopbackServer


def apply_env(env: dict[str, str]) -> None:
    """--env KEY=VALUE: set before the model service loads, as SageMaker's Environment is."""
    os.environ.update(env)


def load_service(model: str) -> ModelService:
    """Load a bundle the way `tfservo serve` does (same SAGEMAKER_* variables)."""
    from tfservo.server.run import build_service
    from tfservo.server.settings import resolve_settings

    settings = resolve_settings(
        paths=[model], host=None, port=None, grpc_port=None, max_request_mb=None,
        version_labels=(), intra_op_threads=None, inter_op_threads=None, log_level=None,
    )
    service = build_service(settings)
    if not service.is_healthy():
        problems = [
            f"model {m.name} version {v.version}: {v.error}"
            for m in service.manager.models()
            for v in m.versions.values()
            if v.error
        ]
        service.close()
        raise JobError(f"{model} has a model with no loadable version: {'; '.join(problems) or 'none loaded'}")
    return service


def loopback_for_handlers(service: ModelService) -> LoopbackServer | None:
    """A started loopback REST + gRPC server when the bundle has handlers (their context.rest_uri,
    grpc_uri and channel reach it) and the service has no server of its own; stop() it after."""
    if not service.invoker.has_handlers() or service.rest_base is not None:
        return None
    from tfservo.server.run import LoopbackServer

    return LoopbackServer(service).start()


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
    check_settings(OutputStore(job.output), job, job_description(job))
    own = service is None
    if service is None:
        apply_env(job.env)
        service = load_service(job.model)
    loopback = loopback_for_handlers(service)
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
