"""What tracing costs a request it does not sample (issue 66: within 3 µs of CPU of tracing off).

A paced load cannot see 3 µs on these cores (its rounds spread by ±30 µs), so this times the
code itself, in one process: tfservo's HTTP tracing edge (`http.tracing_edge.traced`, the
wrapper every HTTP request passes through when tracing is on) around an ASGI app that answers
at once, against the same app called without it. Tracing is configured as `serve` configures
it (OTLP to a loopback address nothing listens on: an unsampled request exports nothing), with
the sampler refusing every request (`traceidratio` 0: the decision is still made, on the trace
id), and with a caller's `traceparent` whose flags say "not sampled" (`parentbased_always_on`:
the parent decides). Each figure is the median of interleaved rounds of process CPU time.

Writes RESULTS/tracing_unsampled.json in the report's section format.

Usage: python bench/tracing_unsampled_bench.py WORKDIR RESULTS [--quick]
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

from report import save_section, section_arguments

from tfservo.core import tracing
from tfservo.http.tracing_edge import traced

BOUND_US = 3.0
PARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"  # a caller's unsampled trace


async def _answer(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def _send(message: dict[str, Any]) -> None:
    return None


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


def _scope(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/invocations", "headers": headers, "scheme": "http",
            "http_version": "1.1", "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 50000),
            "query_string": b"", "state": {}}


def _drive(make: Callable[[], Coroutine[Any, Any, None]], n: int) -> float:
    """CPU seconds for `n` runs of the coroutine `make()` (driven by hand: no event loop's cost in it)."""
    start = time.process_time()
    for _ in range(n):
        coroutine = make()
        try:
            coroutine.send(None)
        except StopIteration:
            pass
    return time.process_time() - start


def measure(label: str, sampler: str, argument: str, headers: list[tuple[bytes, bytes]], rounds: int,
            n: int) -> dict[str, str]:
    """One case's row, in a process of its own (tracing is configured once a process)."""
    # As `serve` has it: the SDK reads its sampler from the process's environment.
    os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                       "OTEL_TRACES_SAMPLER": sampler, "OTEL_TRACES_SAMPLER_ARG": argument,
                       "OTEL_SERVICE_NAME": "bench"})
    assert tracing.configure()
    scope = _scope(headers)
    off: list[float] = []
    on: list[float] = []
    for _ in range(rounds):
        off.append(_drive(lambda: _answer(scope, _receive, _send), n) / n)
        on.append(_drive(lambda: traced(_answer, scope, _receive, _send), n) / n)
    over = statistics.median(b - a for a, b in zip(off, on)) * 1e6
    return {
        "request": label,
        "off, µs a request (the app alone)": f"{statistics.median(off) * 1e6:.2f}",
        "tracing on, unsampled, µs": f"{statistics.median(on) * 1e6:.2f}",
        "over off, µs (median of rounds)": f"+{over:.2f}",
        "bound": f"≤ +{BOUND_US:.0f} µs: {'met' if over <= BOUND_US else 'missed'}",
    }


def main() -> None:
    args = section_arguments()
    rounds, n = (5, 20_000) if args.quick else (11, 100_000)
    headers = [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json"), (b"content-length", b"22"),
               (b"user-agent", b"wrk")]
    cases = [
        ("sampler refuses (traceidratio 0), no traceparent", "traceidratio", "0", headers),
        ("caller's traceparent not sampled (parentbased_always_on)", "parentbased_always_on", "",
         [*headers, (b"traceparent", PARENT)]),
    ]
    spawn = multiprocessing.get_context("spawn")
    rows = []
    for case in cases:
        with spawn.Pool(1) as pool:
            rows.append(pool.apply(measure, (*case, rounds, n)))
    save_section(args.results, "tracing_unsampled", {
        "title": "Tracing on, a request it does not sample: the HTTP edge's CPU over the same request untraced (issue 66)",
        "rows": rows,
        "notes": [
            f"In one process: tfservo's tracing edge around an ASGI app that answers at once, driven by hand "
            f"(no event loop), {n:,} requests a round, {rounds} interleaved rounds of process CPU time; the figure "
            "over off is the median of each round's difference. A paced load on the whole server cannot resolve "
            "a few microseconds on these cores (bench/observability_cpu_bench.py's rounds spread by ±30 µs).",
        ],
    })


if __name__ == "__main__":
    main()
