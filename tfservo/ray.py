"""Ray Data: a bundle in `Dataset.map_batches`, loaded once per actor.

    import ray
    from tfservo.ray import BundlePredictor

    ds = ray.data.from_items([{"id": "a", "x": 1.0}, {"id": "b", "x": 2.0}])
    out = ds.map_batches(BundlePredictor, fn_constructor_args=("model.tar.gz",),
                         compute=ray.data.ActorPoolStrategy(size=2), batch_format="numpy")

Columns named after the signature's inputs go in, its outputs come out beside every other
column (keys); `content_type=` runs a `body` column of raw requests through inference.py
into `response`; `on_error="column"` puts a failed row's error in `error` instead of failing
the batch (pipelines/columns.py).
"""

from __future__ import annotations

from typing import Any

from tfservo.batch.worker.columns import ColumnPredictor
from tfservo.core.extras import require
from tfservo.core.logs import quiet_libraries

require("tfservo.ray", "ray", "ray")

__all__ = ["BundlePredictor"]


class BundlePredictor:
    """A callable class for `map_batches(..., compute=ActorPoolStrategy(...))`: numpy batches in,
    the same rows with prediction columns out. Arguments as ColumnPredictor's."""

    def __init__(self, bundle: str, **selection: Any) -> None:
        quiet_libraries()  # an actor: TensorFlow's noise off there too
        self._predict = ColumnPredictor(bundle, **selection)

    def __call__(self, batch: dict[str, object]) -> dict[str, object]:
        return self._predict(batch)
