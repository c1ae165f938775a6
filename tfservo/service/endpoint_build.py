"""Assembling an endpoint of several bundles: a pipeline's containers, or production and shadow
variants, each bundle its own ModelService built by the factory's one-bundle builder, composed
behind the invoker the doors call (service.pipeline, service.variants).

Called only by `service.factory.build_service`, which hands in its builder.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from tfservo.core import environment
from tfservo.core.settings import Settings, resolve_settings
from tfservo.core.variants_file import VariantSpec, read_variants_file
from tfservo.models.hooks import ModelHooks
from tfservo.service.factory import ModelService
from tfservo.service.pipeline import Container, PipelineInvoker, container_hostnames
from tfservo.service.variants import WEIGHTS_TABLE, EndpointHooks, Variant, VariantInvoker

__all__ = ["build_pipeline", "build_variants"]

Builder = Callable[[Settings, ModelHooks | None], ModelService]

# what a variant's Environment may set for its own bundle (the rest is the server's)
_PER_VARIANT = ("default_model_name", "batching", "intra_op_threads", "inter_op_threads")


def build_pipeline(settings: Settings, build_one: Builder, hooks: ModelHooks | None,
                   endpoint_hooks: EndpointHooks | None) -> ModelService:
    """One service per bundle in settings.paths, in order, behind a PipelineInvoker; the last
    container's service is returned (TF Serving's and V2's routes answer for its models)."""
    names = container_hostnames(settings.container_hostnames, len(settings.paths))
    services: list[ModelService] = []
    try:
        for i, path in enumerate(settings.paths):
            last = i == len(settings.paths) - 1
            services.append(build_one(settings.replace(
                paths=(path,), pipeline=False, variants_file=None, code_only_bundles=True,
                # the default model and version labels name the model container's models
                default_model_name=settings.default_model_name if last else None,
                version_labels=settings.version_labels if last else {},
            ), hooks))
    except BaseException:
        for service in services:
            service.close()
        raise
    primary = services[-1]
    primary.members.extend(services[:-1])
    on_step = endpoint_hooks.on_container if endpoint_hooks is not None else None
    primary.invoker = PipelineInvoker([Container(name, s.invoker) for name, s in zip(names, services)],
                                      settings.pipeline_mode, on_step)
    return primary


def build_variants(settings: Settings, build_one: Builder, hooks: ModelHooks | None,
                   endpoint_hooks: EndpointHooks | None, shared_dir: str | None) -> ModelService:
    """One service per variant of settings.variants_file behind a VariantInvoker; the first
    production variant's service is returned."""
    assert settings.variants_file is not None
    spec = read_variants_file(settings.variants_file)
    declared = (*spec.variants, *spec.shadows)
    services: list[ModelService] = []
    try:
        for variant in declared:
            own = variant_settings(settings, variant)
            service = (build_pipeline(own, build_one, hooks, endpoint_hooks) if variant.pipeline
                       else build_one(own, hooks))
            services.append(service)
            if variant.version_label:  # the model container's calls that name no version
                service.bundle_invoker.label = variant.version_label
    except BaseException:
        for service in services:
            service.close()
        raise
    built = [Variant(v.name, s.invoker, v.weight, v.instances) for v, s in zip(declared, services)]
    primary = services[0]
    primary.members.extend(services[1:])
    primary.invoker = VariantInvoker(
        built[:len(spec.variants)], built[len(spec.variants):],
        weights_path=os.path.join(shared_dir, WEIGHTS_TABLE) if shared_dir else None,
        shadow_queue=settings.shadow_queue, hooks=endpoint_hooks,
    )
    return primary


def variant_settings(settings: Settings, variant: VariantSpec) -> Settings:
    """The server's settings for one variant's bundle: its paths and pipeline, and what its
    Environment changes among the model's own settings (default model, batching, threads)."""
    own = settings.replace(
        paths=variant.paths, variants_file=None, pipeline=variant.pipeline is not None,
        pipeline_mode=variant.pipeline or "serial", container_hostnames=",".join(variant.container_hostnames),
        variant_name=variant.name,
    )
    if not variant.environment:
        return own
    base = {k: v for k, v in environment.current().items() if k != "TFSERVO_VARIANTS"}
    before = resolve_settings(paths=variant.paths, env=base, workers=settings.workers, multi_model=False)
    after = resolve_settings(paths=variant.paths, env={**base, **variant.environment}, workers=settings.workers,
                             multi_model=False)
    changed = {name: getattr(after, name) for name in _PER_VARIANT if getattr(after, name) != getattr(before, name)}
    return own.replace(**changed)
