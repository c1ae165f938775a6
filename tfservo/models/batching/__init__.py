"""Server-side dynamic batching of model calls (TF Serving's batching, in Python)."""

from tfservo.core.batching_options import BatchingOptions
from tfservo.models.batching.batcher import (
    Batcher,
    BatchingRunnerFactory,
    BatchScheduler,
    make_runner_factory,
)

__all__ = [
    "BatchScheduler",
    "Batcher",
    "BatchingOptions",
    "BatchingRunnerFactory",
    "make_runner_factory",
]
