"""Metric updates written in bulk (service.metric_tally) give the exposition observe() and inc()
give one by one; this also pins what it reads of prometheus_client's private histogram fields."""

from __future__ import annotations

import random
import threading

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tfservo.service.metric_tally import Tally
from tfservo.service.metrics import LATENCY_BUCKETS


def exposition(registry: CollectorRegistry) -> list[bytes]:
    """The registry's lines, less the *_created ones (when each child was made)."""
    return [line for line in prometheus_client.generate_latest(registry).splitlines() if b"_created" not in line]


def metrics(registry: CollectorRegistry) -> tuple[Counter, Gauge, Histogram]:
    return (
        Counter("requests", "r", ["route"], registry=registry),
        Gauge("in_flight", "f", registry=registry),
        Histogram("seconds", "s", ["route"], buckets=LATENCY_BUCKETS, registry=registry),
    )


def test_bulk_writes_give_the_exposition_of_updates_one_by_one() -> None:
    direct, bulk = CollectorRegistry(), CollectorRegistry()
    (counter, gauge, histogram), (t_counter, t_gauge, t_histogram) = metrics(direct), metrics(bulk)
    tally = Tally(period=0.001)
    rng = random.Random(7)
    # Powers of two, one or more per bucket: their sums are exact in any order of addition.
    amounts = [rng.choice([2.0**-11, 2.0**-10, 2.0**-9, 2.0**-8, 2.0**-7, 0.5, 2.0, 32.0, 64.0]) for _ in range(3000)]

    def updates(start: int) -> None:
        for i, amount in enumerate(amounts[start::4]):
            route = ("a", "b")[i % 2]
            tally.inc(t_counter.labels(route))
            tally.inc(t_gauge, 1)
            tally.observe(t_histogram.labels(route), amount)
            tally.inc(t_gauge, -1 if i % 3 else 0)

    threads = [threading.Thread(target=updates, args=(k,)) for k in range(4)]  # with the writer thread
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tally.close()
    for k in range(4):
        for i, amount in enumerate(amounts[k::4]):
            route = ("a", "b")[i % 2]
            counter.labels(route).inc()
            gauge.inc(1)
            histogram.labels(route).observe(amount)
            gauge.inc(-1 if i % 3 else 0)
    assert exposition(bulk) == exposition(direct)
    assert any(line.startswith(b'seconds_bucket{le="0.0005",route="a"} ') for line in exposition(bulk))


def test_updates_are_written_by_the_thread_without_a_flush() -> None:
    registry = CollectorRegistry()
    counter, _, histogram = metrics(registry)
    tally = Tally(period=0.01)
    tally.inc(counter.labels("a"), 3)
    tally.observe(histogram.labels("a"), 0.002)
    try:
        for _ in range(500):
            if registry.get_sample_value("seconds_count", {"route": "a"}) == 1:
                break
            threading.Event().wait(0.01)
        assert registry.get_sample_value("requests_total", {"route": "a"}) == 3
        assert registry.get_sample_value("seconds_bucket", {"route": "a", "le": "0.0025"}) == 1
        assert registry.get_sample_value("seconds_bucket", {"route": "a", "le": "0.001"}) == 0
    finally:
        tally.close()
