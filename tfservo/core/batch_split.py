"""How a failed batch splits: the one rule the transform, the pipeline adapters and the batcher follow.

A batch of records (elements, callers' rows) goes to the model in one call. When that call fails:
- an overload or outage (`is_transient`) is no record's fault: the whole batch fails with it, and
  the caller retries or backs off;
- records whose structure (input names, dtypes, inner shapes) disagrees with the rest of the
  batch fail as records — with their own error where they fail alone too, else as Disagrees:
  they are what made the batch invalid, and `/invocations` refuses the same body whole. The
  rest are run again together (the batch's structure is its largest group's, unless that whole
  group fails on its own);
- otherwise each record runs alone, so only the records that fail on their own fail.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar, Union

import numpy as np

from tfservo.core.errors import Code, InvalidArgument, ServingError

__all__ = ["Disagrees", "Failed", "NotTried", "TRANSIENT", "inputs_structure", "is_transient", "isolate", "run_split"]

T = TypeVar("T")
R = TypeVar("R")

TRANSIENT = (Code.UNAVAILABLE, Code.RESOURCE_EXHAUSTED, Code.DEADLINE_EXCEEDED)


def is_transient(error: BaseException) -> bool:
    """Overload or outage: retried with back-off, never split per record."""
    return isinstance(error, ServingError) and error.code in TRANSIENT


def inputs_structure(inputs: Mapping[str, np.ndarray]) -> str:
    """One record's input arrays (batch first) as a structure: names, dtypes and inner shapes."""
    return ", ".join(f"{name}: {value.dtype} of shape {list(value.shape[1:])}" for name, value in sorted(inputs.items()))


class Disagrees(InvalidArgument):
    """A record whose structure is not the rest of its batch's; the message says both."""


@dataclass(frozen=True)
class Failed(Generic[T]):
    """A record that failed: the record and its own error."""

    item: T
    error: BaseException


@dataclass(frozen=True)
class NotTried(Generic[T]):
    """A record left untried because an earlier one failed and the caller stops at the first."""

    item: T


Outcome: TypeAlias = Union[R, Failed[T], NotTried[T]]  # noqa: UP007 - a generic alias of TypeVars


def run_split(
    items: Sequence[T],
    run: Callable[[Sequence[T]], Sequence[R]],
    *,
    structure: Callable[[T], Hashable] | None = None,
    stop_at_first: bool = False,
) -> list[Outcome[R, T]]:
    """`run(items)` (one result per item), split by the rule above when it raises. `structure`
    describes a record (its str is quoted in a Disagrees message; raising is the record's own
    failure); without it, records are only isolated. Transient errors are raised."""
    try:
        results = run(items)
    except Exception as exc:
        return isolate(items, exc, run, structure=structure, stop_at_first=stop_at_first)
    return list(results)


def isolate(
    items: Sequence[T],
    error: Exception,
    run: Callable[[Sequence[T]], Sequence[R]],
    *,
    structure: Callable[[T], Hashable] | None = None,
    stop_at_first: bool = False,
) -> list[Outcome[R, T]]:
    """The outcomes of `items` after their batch failed with `error` (see the module's rule)."""
    if is_transient(error):
        raise error
    if len(items) == 1:
        return [Failed(items[0], error)]
    outcomes: list[Outcome[R, T] | None] = [None] * len(items)
    groups = _groups(items, structure, outcomes) if structure is not None else [(None, list(range(len(items))))]
    if len(groups) == 1:
        for i in groups[0][1]:
            outcomes[i] = _alone(items[i], run)
            if stop_at_first and isinstance(outcomes[i], Failed):
                break
        return _stopped(items, outcomes) if stop_at_first else _done(outcomes)
    # The batch's structure is its largest group's (a tie: the earliest), unless every record of
    # that group fails on its own: then the next group's.
    for n, (batch_shape, members) in enumerate(groups):
        group = [items[i] for i in members]
        for i, outcome in zip(members, run_split(group, run) if len(group) > 1 else [_alone(group[0], run)]):
            outcomes[i] = outcome
        if not all(isinstance(outcomes[i], Failed) for i in members):
            for shape, others in groups[n + 1:]:
                for i in others:
                    outcomes[i] = _disagreeing(items[i], run, shape, batch_shape)
            break
    return _stopped(items, outcomes) if stop_at_first else _done(outcomes)


def _alone(item: T, run: Callable[[Sequence[T]], Sequence[R]]) -> Outcome[R, T]:
    """One record as a call of its own: its result, or its own failure."""
    try:
        return run([item])[0]
    except Exception as exc:
        if is_transient(exc):
            raise
        return Failed(item, exc)


def _disagreeing(item: T, run: Callable[[Sequence[T]], Sequence[R]], shape: Hashable, batch_shape: Hashable) -> Failed[T]:
    """A record of another structure than its batch's: its own error when it fails alone too,
    else Disagrees (its answer alone is not the answer to the batch it came in)."""
    outcome = _alone(item, run)
    if isinstance(outcome, Failed):
        return outcome
    return Failed(item, Disagrees(
        f"its instances are {shape}, the rest of its mini-batch's are {batch_shape}: every instance "
        "of one request must agree, as /invocations requires of the same body; send such records "
        "apart (BatchStrategy SingleRecord) or make them agree"
    ))


def _groups(
    items: Sequence[T], structure: Callable[[T], Hashable], outcomes: list[Outcome[R, T] | None]
) -> list[tuple[Hashable, list[int]]]:
    """The records' indices by structure, the largest group first (a tie: the earliest); a
    record whose structure cannot be told has failed on its own (its outcome set)."""
    by_shape: dict[Hashable, list[int]] = {}
    for i, item in enumerate(items):
        try:
            shape = structure(item)
        except Exception as exc:
            if is_transient(exc):
                raise
            outcomes[i] = Failed(item, exc)
            continue
        by_shape.setdefault(shape, []).append(i)
    return sorted(by_shape.items(), key=lambda group: (-len(group[1]), group[1][0])) or [(None, [])]


def _stopped(items: Sequence[T], outcomes: list[Outcome[R, T] | None]) -> list[Outcome[R, T]]:
    """Outcomes up to the first failure, the records after it NotTried."""
    out: list[Outcome[R, T]] = []
    failed = False
    for item, outcome in zip(items, outcomes):
        if failed or outcome is None:
            out.append(NotTried(item))
            continue
        out.append(outcome)
        failed = isinstance(outcome, Failed)
    return out


def _done(outcomes: list[Outcome[R, T] | None]) -> list[Outcome[R, T]]:
    assert all(outcome is not None for outcome in outcomes)
    return [outcome for outcome in outcomes if outcome is not None]
