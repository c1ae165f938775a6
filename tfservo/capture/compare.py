"""A shadow test's verdict: the production variant's Data Capture and the shadow's, paired by the
eventId they share, compared answer by answer — identical bytes, numbers within a tolerance,
different — with each side's latency. What `tfservo compare` prints.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from tfservo.core.errors import InvalidArgument
from tfservo.storage.urls import url_to_fs

__all__ = ["Captured", "Comparison", "compare_captures", "read_capture"]

_EXAMPLES = 5  # differing eventIds shown


@dataclass(frozen=True)
class Captured:
    """One captured answer: its bytes, content type and latency (ms; None when not recorded)."""

    output: bytes
    content_type: str
    latency_ms: float | None


@dataclass
class Comparison:
    """The pairs' agreement and the two sides' latencies."""

    production: str
    shadow: str
    pairs: int = 0
    production_only: int = 0
    shadow_only: int = 0
    identical: int = 0
    within_tolerance: int = 0
    different: int = 0
    max_abs_difference: float = 0.0
    mean_abs_difference: float = 0.0
    production_latency_ms: dict[str, float] = field(default_factory=dict)
    shadow_latency_ms: dict[str, float] = field(default_factory=dict)
    different_examples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def lines(self) -> list[str]:
        """The report, for a terminal."""
        agree = self.identical + self.within_tolerance
        share = f"{100 * agree / self.pairs:.1f} %" if self.pairs else "-"
        out = [
            f"production {self.production}",
            f"shadow     {self.shadow}",
            f"{self.pairs} requests answered by both ({self.production_only} by production only, "
            f"{self.shadow_only} by the shadow only)",
            f"agreement: {share} — {self.identical} identical, {self.within_tolerance} within the tolerance, "
            f"{self.different} different",
            f"numeric difference: max {self.max_abs_difference:.6g}, mean {self.mean_abs_difference:.6g}",
        ]
        for side, latency in (("production", self.production_latency_ms), ("shadow", self.shadow_latency_ms)):
            if latency:
                out.append(f"{side} latency: p50 {latency['p50']:.2f} ms, p99 {latency['p99']:.2f} ms, "
                           f"max {latency['max']:.2f} ms")
        if self.different_examples:
            out.append("different, e.g. eventId " + ", ".join(self.different_examples))
        return out


def read_capture(url: str) -> dict[str, Captured]:
    """Every captured answer under `url` (a variant's folder or prefix), by eventId."""
    fs, root = url_to_fs(url)
    if not fs.exists(root):
        raise InvalidArgument(f"{url} does not exist; give a variant's capture folder, "
                              "DESTINATION/ENDPOINT/VARIANT")
    found: dict[str, Captured] = {}
    for path in sorted(fs.find(root)):
        if not path.endswith(".jsonl"):
            continue
        with fs.open(path, "rb") as f:
            for line in f:
                record = _record(line, path)
                if record is not None:
                    found[record[0]] = record[1]
    return found


def _record(line: bytes, path: str) -> tuple[str, Captured] | None:
    try:
        doc = orjson.loads(line)
        metadata = doc["eventMetadata"]
        output = doc["captureData"].get("endpointOutput")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise InvalidArgument(f"{path}: a line that is not Data Capture's format") from None
    if output is None:
        raise InvalidArgument(f"{path}: the capture has no endpointOutput; capture Output (CaptureMode) to compare")
    data = output.get("data", "")
    body = base64.b64decode(data) if output.get("encoding") == "BASE64" else data.encode()
    latency = metadata.get("latencyMs")
    return str(metadata["eventId"]), Captured(body, output.get("observedContentType", ""),
                                              float(latency) if latency is not None else None)


def compare_captures(production: str, shadow: str, tolerance: float = 1e-6) -> Comparison:
    """Pair the two captures by eventId and compare each pair (see the module's docstring)."""
    ours, theirs = read_capture(production), read_capture(shadow)
    result = Comparison(production, shadow)
    shared = sorted(set(ours) & set(theirs))
    result.pairs = len(shared)
    result.production_only = len(set(ours) - set(theirs))
    result.shadow_only = len(set(theirs) - set(ours))
    differences: list[float] = []
    for event_id in shared:
        a, b = ours[event_id], theirs[event_id]
        if a.output == b.output:
            result.identical += 1
            continue
        numbers_a, numbers_b = _numbers(a.output), _numbers(b.output)
        if numbers_a is not None and numbers_b is not None and len(numbers_a) == len(numbers_b):
            gaps = [abs(x - y) for x, y in zip(numbers_a, numbers_b)]
            differences.extend(gaps)
            if all(g <= tolerance * max(1.0, abs(x)) for g, x in zip(gaps, numbers_a)):
                result.within_tolerance += 1
                continue
        result.different += 1
        if len(result.different_examples) < _EXAMPLES:
            result.different_examples.append(event_id)
    if differences:
        result.max_abs_difference = max(differences)
        result.mean_abs_difference = sum(differences) / len(differences)
    result.production_latency_ms = _quantiles([ours[e].latency_ms for e in shared])
    result.shadow_latency_ms = _quantiles([theirs[e].latency_ms for e in shared])
    return result


def _numbers(body: bytes) -> list[float] | None:
    """The numbers of a JSON or CSV answer, in order; None when it holds something else."""
    try:
        return list(_flatten(orjson.loads(body)))
    except (orjson.JSONDecodeError, ValueError):
        pass
    try:
        return [float(v) for v in body.decode().replace("\n", ",").split(",") if v.strip()]
    except (UnicodeDecodeError, ValueError):
        return None


def _flatten(value: Any) -> Iterator[float]:
    if isinstance(value, bool):
        raise ValueError("not a number")
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, list):
        for item in value:
            yield from _flatten(item)
    elif isinstance(value, dict):
        for key in sorted(value):
            yield from _flatten(value[key])
    else:
        raise ValueError("not a number")


def _quantiles(values: list[float | None]) -> dict[str, float]:
    known = sorted(v for v in values if v is not None)
    if not known:
        return {}

    def at(q: float) -> float:
        return known[min(len(known) - 1, max(0, math.ceil(q * len(known)) - 1))]

    return {"p50": at(0.5), "p99": at(0.99), "max": known[-1]}
