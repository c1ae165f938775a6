"""The one batch worker of the pipeline adapters: a batch of elements → one result per element.

Beam's handlers (bundle in-process or a remote endpoint) and the columnar adapters (Ray Data,
Spark) all run a batch here: the elements go to the model in one call of the target's method
(predict, classify, regress, or raw bodies through /invocations in as few calls as their
content type allows); if that call fails, it splits by core.batch_split's rule (elements that
disagree with the rest fail, the others are answered), and each failure names its element
(ElementFailure). An overload or outage (`is_transient`) fails the whole batch: it is no
element's fault, and the caller retries or backs off.

The model is anything with LoadedBundle's methods: predict, classify, regress, invoke_many.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tfservo.batch.worker.elements import serialize_examples, split_outputs, stack_inputs
from tfservo.batch.worker.failures import ElementFailure
from tfservo.batch.worker.target import INVOKE, Target
from tfservo.core.batch_split import Failed, NotTried, inputs_structure, is_transient, isolate
from tfservo.core.errors import InvalidArgument

__all__ = ["BatchModel", "Part", "request_body", "run_batch"]


class BatchModel(Protocol):
    """What answers a batch: a bundle loaded in this process or a remote endpoint's client."""

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def classify(self, examples: Sequence[bytes]) -> Sequence[list[tuple[str, float]]]: ...

    def regress(self, examples: Sequence[bytes]) -> Sequence[float]: ...

    def invoke_many(self, bodies: Sequence[bytes]) -> Sequence[bytes | Exception]: ...


@dataclass(frozen=True)
class Part:
    """The results of one model call over `elements` (the whole batch, or one element after the
    batch failed), starting at `offset` in the batch: per element a value (predict: output name →
    row; classify: [(label, score)]; regress: float; invoke: the answer's bytes) or an
    ElementFailure. `inputs`/`outputs`: what the model was given and answered (predict: the
    arrays; classify/regress: the serialized examples as inputs), for PredictionLogs."""

    offset: int
    elements: list[object]
    results: list[Any]
    inputs: Any = None
    outputs: Any = None

    @property
    def ok(self) -> bool:
        return not any(isinstance(r, ElementFailure) for r in self.results)


def run_batch(model: BatchModel, target: Target, elements: list[object]) -> list[Part]:
    """`elements` through `target` in one call; after a failure, split by core.batch_split's rule:
    elements whose inputs disagree with the rest fail, the rest run together again, and where
    none disagree each runs alone. An overload or outage is raised for the whole batch."""
    indexed = list(enumerate(elements))
    try:
        return [_call(model, target, elements, 0)]
    except Exception as exc:  # any failure: find the element(s) behind it
        structure = None
        if target.method == "predict":
            signature = target.signature
            assert signature is not None
            structure = lambda item: inputs_structure(stack_inputs([item[1]], signature))
        outcomes = isolate(indexed, exc, lambda group: _parts(model, target, group), structure=structure)
    return [
        Part(o.item[0], [o.item[1]], [ElementFailure(o.item[0], o.item[1], o.error)]) if isinstance(o, Failed) else o
        for o in outcomes
        if not isinstance(o, NotTried)
    ]


def _parts(model: BatchModel, target: Target, group: Sequence[tuple[int, object]]) -> list[Part]:
    """One call for `group` (elements with their index in the batch), as a Part per element."""
    part = _call(model, target, [element for _, element in group], group[0][0])
    if len(group) == 1:
        return [part]
    return [_one(part, j, i) for j, (i, _) in enumerate(group)]


def _one(part: Part, j: int, offset: int) -> Part:
    """Element j of a Part, as a Part of its own at `offset`."""
    def row(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: array[j : j + 1] for key, array in value.items()}
        return None if value is None else value[j : j + 1]

    return Part(offset, part.elements[j : j + 1], part.results[j : j + 1], row(part.inputs), row(part.outputs))


def request_body(element: object) -> bytes:
    """A raw request body element (bytes or str) as bytes."""
    if isinstance(element, (bytes, bytearray, memoryview)):
        return bytes(element)
    if isinstance(element, str):
        return element.encode("utf-8")
    raise InvalidArgument(
        f"element is a {type(element).__name__}; with content_type= each element is one request "
        "body (bytes or str)"
    )


def _call(model: BatchModel, target: Target, elements: list[object], offset: int) -> Part:
    """One model call for `elements`: the one place that switches on the target's method."""
    if target.method == INVOKE:
        return _invoke(model, elements, offset)
    if target.method == "predict":
        assert target.signature is not None
        inputs = stack_inputs(elements, target.signature)
        outputs = model.predict(inputs)
        return Part(offset, elements, split_outputs(outputs, len(elements), target.describe()), inputs, outputs)
    examples = serialize_examples(elements, target.feature_types)
    method: Callable[[Sequence[bytes]], Sequence[object]] = model.classify if target.method == "classify" else model.regress
    return Part(offset, elements, list(method(examples)), examples)


def _invoke(model: BatchModel, elements: list[object], offset: int) -> Part:
    """Raw bodies through the invocation path, batched as their content type allows; each
    element gets its own answer or ElementFailure (an overload or outage is raised)."""
    results: list[object] = [None] * len(elements)
    bodies: list[tuple[int, bytes]] = []
    for i, element in enumerate(elements):
        try:
            bodies.append((i, request_body(element)))
        except InvalidArgument as exc:
            results[i] = ElementFailure(offset + i, element, exc)
    answers = model.invoke_many([body for _, body in bodies]) if bodies else []
    for (i, _), answer in zip(bodies, answers):
        if isinstance(answer, Exception):
            if is_transient(answer):
                raise answer
            results[i] = ElementFailure(offset + i, elements[i], answer)
        else:
            results[i] = answer
    return Part(offset, elements, results)
