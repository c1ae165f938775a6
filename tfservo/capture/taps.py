"""Which requests reach Data Capture and the payload log, decided once for every door.

A tap is one sink with the kinds of route it takes ("invocation": SageMaker's invocations;
"inference": TF Serving's and V2's inference, REST and gRPC alike), the share of them it
samples and whether it takes error answers too. A door asks `Taps.taking(kind)` before it keeps
any bytes — the sampling is decided first — and hands the answer's event to `deliver` after the
answer is sent; the sinks format and write off the request path.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tfservo.capture.writer import CaptureEvent

__all__ = ["KINDS", "Sink", "Tap", "Taps"]

KINDS = ("invocation", "inference")


class Sink(Protocol):
    """Where tapped payloads go: Data Capture's writer, the payload logger."""

    def submit(self, event: CaptureEvent) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Tap:
    """One sink, the route kinds it takes, the share of them (percent) and whether errors too."""

    sink: Sink
    kinds: frozenset[str]
    percentage: float = 100.0
    errors_too: bool = False


class Taps:
    """The taps of one server, shared by its doors."""

    def __init__(self, taps: Sequence[Tap] = ()) -> None:
        self.taps = tuple(taps)

    def __bool__(self) -> bool:
        return bool(self.taps)

    def taking(self, kind: str | None) -> list[Tap]:
        """The taps that take this request (sampled now, before anything is kept)."""
        return [t for t in self.taps if kind in t.kinds and (t.percentage >= 100 or random.random() * 100 < t.percentage)]

    @staticmethod
    def deliver(taking: Sequence[Tap], event: CaptureEvent, ok: bool) -> None:
        """The answered request to each tap that took it (an error only to those that want errors)."""
        for tap in taking:
            if ok or tap.errors_too:
                tap.sink.submit(event)

    def deliver_copy(self, event: CaptureEvent, ok: bool) -> None:
        """A shadow variant's answer to its copy of a request, to the taps of invocations (its
        copies were sampled already, by the shadow's weight)."""
        self.deliver([t for t in self.taps if "invocation" in t.kinds], event, ok)

    def close(self) -> None:
        for tap in self.taps:
            tap.sink.close()
