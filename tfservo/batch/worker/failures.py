"""Per-element failures of a batch.

When a batch fails the handlers retry its elements one by one; each bad one becomes an
ElementFailure, and ElementErrors' message names them (index in the batch, the element itself
and its own error). Under `RunInference(...).with_exception_handling()` each bad element is
dead-lettered on its own as `([element], (ElementErrors, repr(error), traceback))` (see
dead_letters.py); elsewhere ElementErrors is raised for the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfservo.core.errors import Code, ServingError

__all__ = ["describe_element", "ElementErrors", "ElementFailure"]

_SHOWN = 200  # characters of an element quoted in a message


@dataclass(frozen=True)
class ElementFailure:
    """One element that failed on its own: its position in the batch, the element, its error."""

    index: int
    element: object
    error: BaseException


class ElementErrors(ServingError):
    """Some elements of a batch failed when run one by one; `failures` lists them."""

    def __init__(self, failures: Sequence[ElementFailure], batch_size: int, where: str) -> None:
        first = failures[0].error
        code = first.code if isinstance(first, ServingError) else Code.INTERNAL
        lines = [
            f"element {f.index} ({describe_element(f.element)}): {_error_text(f.error)}" for f in failures
        ]
        super().__init__(
            f"{len(failures)} of {batch_size} elements failed ({where}); " + "; ".join(lines),
            code,
        )
        self.failures = list(failures)
        self.batch_size = batch_size

    def __reduce__(self) -> tuple[Callable[..., ServingError], tuple[type, str, Code]]:
        # pickles across Beam's process boundaries with its message intact
        return (_rebuild, (type(self), self.message, self.code))


def _rebuild(cls: type, message: str, code: Code) -> ServingError:
    error: Any = ServingError.__new__(cls)
    ServingError.__init__(error, message, code)
    error.failures, error.batch_size = [], 0
    rebuilt: ServingError = error
    return rebuilt


def describe_element(element: object) -> str:
    """A short, one-line rendering of an element for messages."""
    if isinstance(element, np.ndarray):
        text = f"array{list(element.shape)} {element.dtype}: " + np.array2string(
            element, threshold=8, edgeitems=2, separator=","
        ).replace("\n", "")
    elif isinstance(element, (bytes, bytearray)):
        text = repr(bytes(element[:_SHOWN]))
    elif hasattr(element, "SerializeToString") and hasattr(element, "ListFields"):
        from google.protobuf import text_format

        text = f"{type(element).__name__} {{{text_format.MessageToString(element, as_one_line=True)}}}"
    else:
        text = repr(element)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + f"... ({len(text)} characters)"


def _error_text(error: BaseException) -> str:
    if isinstance(error, ServingError):
        return error.message
    return f"{type(error).__name__}: {error}"
