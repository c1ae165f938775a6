"""Tensor dimensions a client sent, checked before any array is made: a shape whose element
count no array could hold (absurd dims, even beside a 0) is the client's mistake."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tfservo.core.errors import InvalidArgument

__all__ = ["MAX_ELEMENTS", "element_count"]

MAX_ELEMENTS = 2**48  # far past any request body's worth of values; numpy's own limit is ~2**63 bytes


def element_count(shape: Sequence[int], name: str) -> int:
    """The number of elements of `shape`; InvalidArgument naming `name` when its dims (a 0
    counted as 1) multiply past MAX_ELEMENTS."""
    spread = 1
    for d in shape:
        spread *= max(int(d), 1)
    if spread > MAX_ELEMENTS:
        raise InvalidArgument(
            f"{name} has shape {list(shape)}, more elements than any tensor can hold; send its real dimensions"
        )
    return math.prod(shape)
