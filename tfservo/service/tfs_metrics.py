"""TF Serving's Prometheus metrics, under its names, for dashboards built on TF Serving.

TF Serving exports its TensorFlow monitoring metrics with `/` turned into `:`
(`:tensorflow:serving:request_count`), latencies in microseconds in exponential buckets, and
counters without prometheus_client's `_total` suffix — so the text is written here rather than
by prometheus_client, whose conventions differ. Served at the path of
`--monitoring_config_file` (`prometheus_config { enable: true path: "..." }`); tfservo's own
`/metrics` stays. Values are per serving process (with `--workers N`, per worker).
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from collections.abc import Sequence

__all__ = ["TFServingMetrics"]

def _exponential(start: float, factor: float, count: int) -> list[float]:
    return [start * factor**i for i in range(count)]


LATENCY_BUCKETS_US = _exponential(10, 1.8, 33)  # request and runtime latency
QUEUING_BUCKETS_US = _exponential(100, 1.2, 52)  # batching_session:queuing_latency
BATCH_SIZE_BUCKETS = [float(2**i) for i in range(14)]


class _Histogram:
    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum += value
        self.count += 1


class TFServingMetrics:
    """The values behind TF Serving's metric names, fed by tfservo's hooks."""

    _HELP = {
        ":tensorflow:serving:request_count": ("counter", "The total number of requests."),
        ":tensorflow:serving:request_latency": (
            "histogram", "Distribution of wall time (in microseconds) for Tensorflow Serving request."),
        ":tensorflow:serving:runtime_latency": (
            "histogram", "Distribution of wall time (in microseconds) for Tensorflow runtime."),
        ":tensorflow:serving:batching_session:queuing_latency": (
            "histogram", "Distribution of wall time spent (in microseconds) in queuing"),
        ":tensorflow:serving:batching_session:input_batch_size": (
            "histogram", "Tracks the batch size distribution on the inputs by model_name (if available)."),
        ":tensorflow:serving:batching_session:processed_batch_size": (
            "histogram", "Tracks the batch size distribution on processing by model_name (if available)."),
        ":tensorflow:core:graph_runs": (
            "counter", "The number of graph executions used to collect /tensorflow/core/graph_run_time_usecs"),
        ":tensorflow:cc:saved_model:load_latency": (
            "counter", "Latency in microseconds for SavedModels that were successfully loaded."),
        ":tensorflow:cc:saved_model:load_attempt_count": (
            "counter", "The number of times a SavedModel was successfully loaded."),
    }

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
        self._histograms: dict[str, dict[tuple[tuple[str, str], ...], _Histogram]] = defaultdict(dict)

    # -- hooks -------------------------------------------------------------------------------

    def request(self, model: str, api: str, entrypoint: str, status: str, seconds: float) -> None:
        """One answered request (entrypoint REST or GRPC; status a canonical code name)."""
        self._inc(":tensorflow:serving:request_count", (("model_name", model), ("status", status)))
        self._observe(":tensorflow:serving:request_latency", LATENCY_BUCKETS_US,
                      (("API", api), ("entrypoint", entrypoint), ("model_name", model)), seconds * 1e6)

    def runtime(self, model: str, api: str, seconds: float) -> None:
        """One model call in the runtime (a whole batch when batching)."""
        self._observe(":tensorflow:serving:runtime_latency", LATENCY_BUCKETS_US,
                      (("API", api), ("model_name", model), ("runtime", "TF1")), seconds * 1e6)
        self._inc(":tensorflow:core:graph_runs", ())

    def batch(self, model: str, real: int, padded: int, queued_seconds: float) -> None:
        labels = (("model_name", model),)
        self._observe(":tensorflow:serving:batching_session:queuing_latency", QUEUING_BUCKETS_US,
                      (("thread_pool_name", model),), queued_seconds * 1e6)
        self._observe(":tensorflow:serving:batching_session:input_batch_size", BATCH_SIZE_BUCKETS, labels, real)
        self._observe(":tensorflow:serving:batching_session:processed_batch_size", BATCH_SIZE_BUCKETS, labels, padded)

    def load(self, model_path: str, ok: bool, seconds: float | None) -> None:
        self._inc(":tensorflow:cc:saved_model:load_attempt_count",
                  (("model_path", model_path), ("status", "success" if ok else "fail")))
        if ok and seconds is not None:
            self._inc(":tensorflow:cc:saved_model:load_latency", (("model_path", model_path),), seconds * 1e6)

    # -- exposition ----------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """TF Serving's Prometheus text."""
        out: list[str] = []
        with self._lock:
            for name, (kind, help_text) in self._HELP.items():
                out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
                if kind == "counter":
                    for labels, value in self._counters.get(name, {}).items():
                        out.append(f"{name}{_labels(labels)} {_number(value)}\n")
                    continue
                for labels, hist in self._histograms.get(name, {}).items():
                    running = 0
                    for bound, count in zip([*hist.buckets, math.inf], hist.counts):
                        running += count
                        le = "+Inf" if bound == math.inf else _number(bound)
                        out.append(f"{name}_bucket{_labels((*labels, ('le', le)))} {running}\n")
                    out.append(f"{name}_sum{_labels(labels)} {_number(hist.sum)}\n")
                    out.append(f"{name}_count{_labels(labels)} {hist.count}\n")
        return "".join(out).encode()

    def _inc(self, name: str, labels: tuple[tuple[str, str], ...], by: float = 1.0) -> None:
        with self._lock:
            series = self._counters[name]
            series[labels] = series.get(labels, 0.0) + by

    def _observe(self, name: str, buckets: Sequence[float], labels: tuple[tuple[str, str], ...], value: float) -> None:
        with self._lock:
            series = self._histograms[name]
            hist = series.get(labels)
            if hist is None:
                hist = series[labels] = _Histogram(buckets)
            hist.observe(value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Sequence[tuple[str, str]]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))
