"""Items handed from the threads that add them to the one thread that takes them."""

from __future__ import annotations

from collections import deque
from typing import TypeVar

__all__ = ["take_all"]

T = TypeVar("T")


def take_all(items: deque[T]) -> list[T]:
    """Everything in `items`, oldest first, taken while other threads may still append (each
    `popleft` is atomic; an item appended meanwhile is taken too, or left for the next call)."""
    pop, taken = items.popleft, []
    try:
        while True:
            taken.append(pop())
    except IndexError:
        return taken
