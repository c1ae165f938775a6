"""The handlers' Beam metrics (namespace "tfservo"), beside the ones RunInference reports itself.

Ours are counted inside run_inference, so they hold wherever the handler runs (RunInference,
KeyedModelHandler with many models, a transform pipeline calling it directly):

- inferences (counter): elements answered;
- failed_inferences (counter): elements that failed on their own (see failures.py);
- batch_size (distribution): elements per run_inference call;
- batch_latency_micros (distribution): time per run_inference call;
- model_load_millis (distribution): one value per model load (reported by the first batch
  after it, because Beam does not collect metrics while a DoFn is set up);
- remote_retries (counter): retried remote calls (429/503, RESOURCE_EXHAUSTED/UNAVAILABLE);
- model_swaps (counter): batches answered by another model than the batch before (a model
  update, or a new version followed);
- model_update_failures (counter): model updates whose bundle did not load (the previous
  model kept answering);
- namespace "tfservo.models", one counter per model id: elements each model answered.
"""

from __future__ import annotations

from apache_beam.metrics.metric import Metrics

__all__ = ["NAMESPACE", "count_retry", "HandlerMetrics"]

NAMESPACE = "tfservo"


class HandlerMetrics:
    """Beam metric cells for one handler (created lazily: Beam wants them where they are used)."""

    def __init__(self) -> None:
        self.inferences = Metrics.counter(NAMESPACE, "inferences")
        self.failed_inferences = Metrics.counter(NAMESPACE, "failed_inferences")
        self.batch_size = Metrics.distribution(NAMESPACE, "batch_size")
        self.batch_latency_micros = Metrics.distribution(NAMESPACE, "batch_latency_micros")
        self.model_load_millis = Metrics.distribution(NAMESPACE, "model_load_millis")
        self.model_swaps = Metrics.counter(NAMESPACE, "model_swaps")
        self.model_update_failures = Metrics.counter(NAMESPACE, "model_update_failures")

    def per_model(self, model_id: str, size: int) -> None:
        """`size` elements sent to the model `model_id`."""
        Metrics.counter(f"{NAMESPACE}.models", model_id).inc(size)

    def batch(self, size: int, seconds: float, failed: int = 0) -> None:
        """Record one run_inference call of `size` elements, `failed` of which failed."""
        self.batch_size.update(size)
        self.batch_latency_micros.update(int(seconds * 1e6))
        if size - failed:
            self.inferences.inc(size - failed)
        if failed:
            self.failed_inferences.inc(failed)


def count_retry() -> None:
    """One retried remote call."""
    Metrics.counter(NAMESPACE, "remote_retries").inc()
