"""Per model version inference statistics, as the Open Inference Protocol's statistics extension
reports them (`GET /v2/models/{m}/stats`, gRPC ModelStatistics; what Triton's clients and
perf_analyzer read): successful and failed requests with their time, model executions with
their compute and queue time, and the last inference. Counted by the metrics every door records
through, so each door's requests count; per serving process (a worker's own traffic)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

__all__ = ["INFERENCE_METHODS", "ModelStatistics", "VersionStatistics"]

# The request methods that are inferences (metadata, status and readiness calls are not).
INFERENCE_METHODS = frozenset({"predict", "classify", "regress", "multi_inference", "invoke"})


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9)

    def doc(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class VersionStatistics:
    """One model version's counts (the fields of V2's ModelStatistics)."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference: int = 0  # milliseconds since the epoch
    batches: dict[int, Duration] = field(default_factory=dict)  # batch size → its executions' compute time


class ModelStatistics:
    """The statistics of every model version this process served; safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: dict[tuple[str, str], VersionStatistics] = {}
        self._latest: dict[str, str] = {}  # model → the version its last request named

    def answered(self, model: str, version: str, ok: bool, seconds: float) -> None:
        """One inference request of `model` `version` ended (`ok`: with an answer)."""
        with self._lock:
            stats = self._of(model, version)
            (stats.success if ok else stats.fail).add(seconds)
            if ok:
                stats.inference_count += 1
            stats.last_inference = int(time.time() * 1000)
            self._latest[model] = version

    def executed(self, model: str, version: str | None, rows: int, seconds: float, queued: float = 0.0) -> None:
        """One model call of `rows` rows took `seconds` after waiting `queued` seconds for its batch;
        `version`: None where the call's version is not known (a batch), the model's last one then."""
        with self._lock:
            stats = self._of(model, version or self._latest.get(model, ""))
            stats.execution_count += 1
            stats.compute_infer.add(seconds)
            if queued:
                stats.queue.add(queued)
            if rows:  # an unbatched call's rows are not counted where it runs
                stats.batches.setdefault(rows, Duration()).add(seconds)

    def of(self, model: str, version: str) -> VersionStatistics:
        """A copy of one version's counts (zeros if it served nothing yet)."""
        with self._lock:
            found = self._versions.get((model, version))
            if found is None:
                return VersionStatistics()
            return VersionStatistics(
                Duration(**vars(found.success)), Duration(**vars(found.fail)), Duration(**vars(found.queue)),
                Duration(**vars(found.compute_infer)), found.inference_count, found.execution_count,
                found.last_inference, {size: Duration(**vars(d)) for size, d in found.batches.items()},
            )

    def _of(self, model: str, version: str) -> VersionStatistics:
        key = (model, version)
        stats = self._versions.get(key)
        if stats is None:
            stats = self._versions[key] = VersionStatistics()
        return stats
