"""What the model layer tells the metrics: one small record of callbacks, built once by the
runtime (`Metrics.model_hooks`) and handed down to the manager, its versions and the batchers.

Every hook is optional and must never raise; each is called on the request path or a batch
thread, so each does no more than record a number.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tfservo.models.servables import ServableVersion

__all__ = ["BatchHook", "CountHook", "ModelHooks", "RunHook"]

BatchHook = Callable[[str, int, int, float, float], None]  # model, rows, padded rows, run s, queued s
RunHook = Callable[[str, float], None]  # model, seconds of one unbatched model call
CountHook = Callable[[str, int], None]  # model, change (+n / -n) of a count


@dataclass(frozen=True)
class ModelHooks:
    """The model layer's callbacks (all optional)."""

    on_event: Callable[[ServableVersion], None] | None = None  # a version changed state
    on_batch: BatchHook | None = None  # the batcher ran a batch
    on_run: RunHook | None = None  # an unbatched call finished
    on_hold: CountHook | None = None  # a request took (+1) or gave back (-1) a version's handle
    on_queue: CountHook | None = None  # rows joined (+n) or left (-n) the batcher's queue
