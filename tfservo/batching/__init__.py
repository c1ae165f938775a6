"""Server-side dynamic batching of model calls (TF Serving's batching, in Python)."""

from tfservo.batching.batcher import (
    Batcher,
    BatchingRunnerFactory,
    BatchScheduler,
    make_runner_factory,
)
from tfservo.batching.options import BatchingOptions

__all__ = [
    "BatchScheduler",
    "Batcher",
    "BatchingOptions",
    "BatchingRunnerFactory",
    "make_runner_factory",
]
