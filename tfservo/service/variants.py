"""Production variants and shadow variants behind one endpoint, as SageMaker runs them.

`VariantInvoker.choose` is the one decision of which variant answers: the one TargetVariant
names, else one drawn by the variants' current weights. Weights live in a table every worker of
the server shares (UpdateEndpointWeightsAndCapacities changes them for the server, not one
worker, and a request in flight keeps the variant it drew). Every answer carries the variant's
name (X-Amzn-Invoked-Production-Variant at the door, `{endpoint}/{variant}/` in Data Capture).

A shadow variant gets a copy of a share of the requests (its weight over the production
weights' sum) after the production answer is made: the copy waits in a bounded queue for the
shadow's own threads, so a slow or failing shadow never delays or fails the production answer;
a copy that finds the queue full is dropped and counted. The shadow's answer is handed to Data
Capture under the shadow's name with the production line's eventId, for `tfservo compare`.
"""

from __future__ import annotations

import logging
import queue
import random
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tfservo.capture.writer import new_event_id
from tfservo.core.errors import InvalidArgument
from tfservo.core.shared_table import SharedTable, create_table
from tfservo.service.invocation import (
    ComposedInvoker,
    InvocationResult,
    Invoker,
    NotRoutable,
    PreparedInvocation,
    error_result,
)

__all__ = [
    "WEIGHTS_TABLE",
    "EndpointHooks",
    "ShadowAnswer",
    "UnknownVariant",
    "Variant",
    "VariantInvoker",
    "Weights",
    "create_weights_table",
]

log = logging.getLogger("tfservo.variants")

WEIGHTS_TABLE = "variant-weights"  # its file's name in the server's shared folder
_SLOTS = 64  # ten production variants and a shadow, with room
_RECORD = struct.Struct("<dq")  # (weight, instance count)
_SHADOW_THREADS = 4  # a shadow's calls at once, per worker: what a slow shadow may take of the cores


class UnknownVariant(NotRoutable):
    """TargetVariant names no production variant of this endpoint (the runtime API: 400)."""


@dataclass(frozen=True)
class EndpointHooks:
    """What variants and pipelines tell the metrics (all optional, never raising)."""

    on_variant: Callable[[str, int, float], None] | None = None  # variant, status, seconds
    on_shadow: Callable[[str, str], None] | None = None  # shadow variant, outcome (sent, dropped, failed)
    on_container: Callable[[str, float, bool], None] | None = None  # pipeline container, seconds, ok


@dataclass
class Variant:
    """One variant: its name and its bundle's (or pipeline's) invoker."""

    name: str
    invoker: Invoker
    weight: float = 1.0
    instances: int = 1


@dataclass(frozen=True)
class ShadowAnswer:
    """A shadow's answer to its copy of a request, for Data Capture beside the production line."""

    variant: str
    capture_id: str
    request: bytes
    request_type: str | None
    result: InvocationResult
    arrived: float  # seconds since the epoch, when the production request arrived
    seconds: float  # the shadow's own time for it
    inference_id: str | None = None


def create_weights_table(path: str) -> None:
    """Make the zeroed table the workers of one server read their variants' weights from."""
    create_table(path, _SLOTS, _RECORD)


class Weights:
    """The variants' weights and instance counts: the server's (a shared table) or this process's."""

    def __init__(self, initial: Mapping[str, tuple[float, int]], path: str | None = None) -> None:
        self._table = SharedTable(_SLOTS, _RECORD, path)
        self.names = list(initial)
        with self._table.locked():
            if self._table.get("set") is None:  # the first worker writes the file's weights
                for name, (weight, instances) in initial.items():
                    self._table.put(name, (float(weight), int(instances)), None)
                self._table.put("set", (1.0, 1), None)

    def current(self) -> dict[str, tuple[float, int]]:
        """Each variant's (weight, instances) now (a glance: an update lands on the next request)."""
        return {name: _pair(self._table.get(name)) for name in self.names}

    def update(self, changes: Mapping[str, tuple[float | None, int | None]]) -> dict[str, tuple[float, int]]:
        """Set weights and instance counts (None: unchanged) at once, for every worker."""
        unknown = sorted(set(changes) - set(self.names))
        if unknown:
            raise UnknownVariant(f"The variant {unknown[0]} is not a production variant of this endpoint; "
                                 f"its variants are {', '.join(self.names)}")
        with self._table.locked():
            now = {n: self._record(n) for n in self.names}
            for name, (weight, instances) in changes.items():
                old_weight, old_instances = now[name]
                if weight is not None and weight < 0:
                    raise InvalidArgument(f"DesiredWeight of {name} must be at least 0, not {weight}")
                if instances is not None and instances < 0:
                    raise InvalidArgument(f"DesiredInstanceCount of {name} must be at least 0, not {instances}")
                now[name] = (old_weight if weight is None else float(weight),
                             old_instances if instances is None else int(instances))
            if sum(w for w, _ in now.values()) <= 0:
                raise InvalidArgument("these weights leave every production variant at 0; keep one above 0")
            for name, values in now.items():
                self._table.put(name, values, None)
        return now

    def _record(self, name: str) -> tuple[float, int]:
        return _pair(self._table.get(name))

    def close(self) -> None:
        self._table.close()


def _pair(record: tuple[object, ...] | None) -> tuple[float, int]:
    """A table record as (weight, instances); a variant not in the table has weight 0."""
    if record is None:
        return 0.0, 1
    weight, instances = record
    assert isinstance(weight, float) and isinstance(instances, int)
    return weight, instances


class _Shadow:
    """A shadow variant: its invoker, its share of requests, its bounded queue and threads."""

    def __init__(self, variant: Variant, share: float, limit: int, hooks: EndpointHooks,
                 deliver: Callable[[ShadowAnswer], None]) -> None:
        self.variant, self.share = variant, share
        self.hooks, self.deliver = hooks, deliver
        self._queue: queue.Queue[tuple[ShadowAnswer, str | None, str | None, str | None] | None] = queue.Queue(limit)
        self._threads = [threading.Thread(target=self._run, name=f"tfservo-shadow-{variant.name}", daemon=True)
                         for _ in range(_SHADOW_THREADS)]
        for thread in self._threads:
            thread.start()

    def offer(self, copy: ShadowAnswer, accept: str | None, attributes: str | None, model: str | None) -> None:
        try:
            self._queue.put_nowait((copy, accept, attributes, model))
        except queue.Full:
            self._count("dropped")

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            copy, accept, attributes, model = item
            started = time.perf_counter()
            try:
                result = self.variant.invoker.invoke(copy.request, copy.request_type, accept, attributes, model)
            except Exception:  # a bug below must not end the shadow's thread
                log.exception("shadow variant %s raised", self.variant.name)
                self._count("failed")
                continue
            result.variant = self.variant.name
            self._count("sent" if result.ok else "failed")
            try:
                self.deliver(ShadowAnswer(self.variant.name, copy.capture_id, copy.request, copy.request_type, result,
                                          copy.arrived, time.perf_counter() - started, copy.inference_id))
            except Exception:
                log.exception("shadow variant %s: its answer could not be captured", self.variant.name)

    def _count(self, outcome: str) -> None:
        if self.hooks.on_shadow is not None:
            self.hooks.on_shadow(self.variant.name, outcome)

    def close(self) -> None:
        for _ in self._threads:
            try:
                self._queue.put(None, timeout=1)
            except queue.Full:
                break
        for thread in self._threads:
            thread.join(timeout=5)


class VariantInvoker(ComposedInvoker):
    """The invocation path of an endpoint of variants (see the module's docstring)."""

    def __init__(
        self, variants: Sequence[Variant], shadows: Sequence[Variant] = (), *, weights_path: str | None = None,
        shadow_queue: int = 256, hooks: EndpointHooks | None = None,
    ) -> None:
        super().__init__(variants[0].invoker)
        self.variants = {v.name: v for v in variants}
        self.hooks = hooks or EndpointHooks()
        self.weights = Weights({v.name: (v.weight, v.instances) for v in variants}, weights_path)
        self.deliver: Callable[[ShadowAnswer], None] = lambda answer: None  # Data Capture's, set by the runtime
        total = sum(v.weight for v in variants) or 1.0
        self._shadows = [_Shadow(s, min(1.0, s.weight / total), shadow_queue, self.hooks,
                                 lambda answer: self.deliver(answer)) for s in shadows]
        self.shadow_names = [s.name for s in shadows]

    def has_handlers(self) -> bool:
        """False when no production variant has handlers: the doors' fast path (a decoded call
        queued for its batch, or run on the loop) stays open, the variant drawn in `prepare`."""
        return any(v.invoker.has_handlers() for v in self.variants.values())

    def prepare(self, body: bytes, content_type: str | None, accept: str | None = None,
                custom_attributes: str | None = None, model_name: str | None = None) -> PreparedInvocation | None:
        variant = self.choose(None)
        prepared = variant.invoker.prepare(body, content_type, accept, custom_attributes, model_name)
        if prepared is None:
            return None
        arrived, started = time.time(), time.perf_counter()
        return prepared._replace(answered=lambda result: self._answered(
            variant, result, arrived, started, body, content_type, accept, custom_attributes, model_name, None))

    def choose(self, target_variant: str | None) -> Variant:
        """The variant that answers: TargetVariant's, else drawn by the current weights."""
        if target_variant is not None:
            found = self.variants.get(target_variant)
            if found is None:
                raise UnknownVariant(
                    f"The variant {target_variant} is not found for this endpoint; its production variants are "
                    f"{', '.join(self.variants)}")
            return found
        weights = self.weights.current()
        if len(weights) == 1:
            return self.variants[next(iter(weights))]
        point = random.random() * sum(w for w, _ in weights.values())
        for name, (weight, _) in weights.items():
            point -= weight
            if point < 0 and weight > 0:
                return self.variants[name]
        return self.variants[max(weights, key=lambda n: weights[n][0])]

    def call(
        self, body: bytes, content_type: str | None, accept: str | None = None, custom_attributes: str | None = None,
        model_name: str | None = None, *, target_variant: str | None = None, target_container: str | None = None,
        inference_id: str | None = None,
    ) -> InvocationResult:
        try:
            variant = self.choose(target_variant)
        except InvalidArgument as exc:
            return error_result(exc)
        arrived, started = time.time(), time.perf_counter()
        result = variant.invoker.call(body, content_type, accept, custom_attributes, model_name,
                                      target_container=target_container)
        self._answered(variant, result, arrived, started, body, content_type, accept, custom_attributes, model_name,
                       inference_id)
        return result

    def _answered(self, variant: Variant, result: InvocationResult, arrived: float, started: float, body: bytes,
                  content_type: str | None, accept: str | None, custom_attributes: str | None,
                  model_name: str | None, inference_id: str | None) -> None:
        """A production answer made: tagged with its variant, counted, and copied to each shadow
        that samples it (the copy waits in the shadow's queue; nothing here blocks)."""
        result.variant = variant.name
        if self.hooks.on_variant is not None:
            self.hooks.on_variant(variant.name, result.status, time.perf_counter() - started)
        for shadow in self._shadows:
            if shadow.share >= 1 or random.random() < shadow.share:
                result.capture_id = result.capture_id or new_event_id()
                shadow.offer(ShadowAnswer(shadow.variant.name, result.capture_id, body, content_type, result, arrived,
                                          0.0, inference_id), accept, custom_attributes, model_name)

    def close(self) -> None:
        for shadow in self._shadows:
            shadow.close()
        self.weights.close()
