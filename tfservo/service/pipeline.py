"""A SageMaker inference pipeline: several bundles ("containers") answering as one model.

In Serial mode each container's answer is the next one's request, as SageMaker passes it: the
body as it is, Content-Type the answer's, Accept and the custom attributes the caller's; the
pipeline answers the last container's bytes. In
Direct mode the caller's TargetContainerHostname picks the one container that runs. A container
that fails ends the invocation with its own status and message, tagged with its hostname
(the runtime API then says "from container-2", as SageMaker does); each container's call is a
span of its own and is counted per container.

Each container is its own ModelService (its models, handlers and batchers: two archives may both
hold a model named "model"), so `PipelineInvoker` is the one place the chain runs: every door
that invokes the service (HTTP, the runtime API, async, every transform engine, the Beam, Ray
and Spark adapters) calls it as it would call one bundle's Invoker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tfservo.core import tracing
from tfservo.core.errors import InvalidArgument
from tfservo.service.invocation import (
    ComposedInvoker,
    InvocationResult,
    Invoker,
    NotRoutable,
    error_result,
)

__all__ = ["MODES", "Container", "PipelineInvoker", "container_hostnames"]

log = logging.getLogger("tfservo.pipeline")

MODES = ("serial", "direct")  # InferenceExecutionConfig's Mode, lower case


@dataclass(frozen=True)
class Container:
    """One container of a pipeline: its hostname and the invoker of its bundle."""

    hostname: str
    invoker: Invoker


def container_hostnames(given: Sequence[str] | str, count: int) -> list[str]:
    """The containers' hostnames: those given (a list, or comma-separated), else container-1, …"""
    names = [n.strip() for n in given.split(",")] if isinstance(given, str) else list(given)
    names = [n for n in names if n]
    if not names:
        return [f"container-{i + 1}" for i in range(count)]
    if len(names) != count or len(set(names)) != count:
        raise InvalidArgument(f"--container-hostnames names {len(names)} distinct containers for {count} bundles; "
                              "give one name per bundle, in order")
    return names


class PipelineInvoker(ComposedInvoker):
    """The invocation path of a pipeline (see the module's docstring)."""

    def __init__(
        self, containers: Sequence[Container], mode: str = "serial",
        on_step: Callable[[str, float, bool], None] | None = None,
    ) -> None:
        super().__init__(containers[-1].invoker)
        self.containers = list(containers)
        self.mode = mode
        self.on_step = on_step or (lambda container, seconds, ok: None)  # the metrics' per-container count

    def call(
        self, body: bytes, content_type: str | None, accept: str | None = None, custom_attributes: str | None = None,
        model_name: str | None = None, *, target_variant: str | None = None, target_container: str | None = None,
    ) -> InvocationResult:
        if self.mode == "direct":
            return self._direct(body, content_type, accept, custom_attributes, model_name, target_container)
        if target_container is not None:
            return error_result(NotRoutable(
                f"TargetContainerHostname {target_container} is for Direct invocation; this pipeline is Serial "
                "(tfservo serve --pipeline-mode direct)"))
        result: InvocationResult | None = None
        for i, container in enumerate(self.containers):
            last = i == len(self.containers) - 1
            # the caller's model name is for the container that holds it: the last one's, by default
            result = self._step(container, i, body, content_type, accept, custom_attributes,
                                model_name if last else None)
            if not result.ok or last:
                break
            body, content_type = result.body, result.content_type
        assert result is not None
        if result.ok and result.answer is not None:
            # the last container's answer as its bytes, as SageMaker hands them on: a transform then
            # splits it as any handler's answer, the same as one bundle doing every step would give
            written = result.encoded()
            if not written.ok:
                return written
            result = InvocationResult(written.status, written.body, written.content_type,
                                      custom_attributes=written.custom_attributes)
            result.container = self.containers[-1].hostname
        return result

    def _direct(self, body: bytes, content_type: str | None, accept: str | None, custom_attributes: str | None,
                model_name: str | None, target: str | None) -> InvocationResult:
        names = [c.hostname for c in self.containers]
        if target is None:
            return error_result(NotRoutable(
                "This endpoint's containers are invoked directly: set TargetContainerHostname "
                f"(X-Amzn-SageMaker-Target-Container-Hostname) to one of {', '.join(names)}"))
        if target not in names:
            return error_result(NotRoutable(
                f"TargetContainerHostname {target} is not a container of this endpoint; its containers are "
                f"{', '.join(names)}"))
        i = names.index(target)
        return self._step(self.containers[i], i, body, content_type, accept, custom_attributes, model_name)

    def _step(self, container: Container, index: int, body: bytes, content_type: str | None, accept: str | None,
              custom_attributes: str | None, model_name: str | None) -> InvocationResult:
        started = time.perf_counter()
        with tracing.span("pipeline.container", {"tfservo.container": container.hostname,
                                                 "tfservo.container_index": index + 1}):
            result = container.invoker.invoke(body, content_type, accept, custom_attributes, model_name)
        self.on_step(container.hostname, time.perf_counter() - started, result.ok)
        result.container = container.hostname
        if not result.ok:
            log.debug("pipeline container %s answered %d", container.hostname, result.status)
        return result
