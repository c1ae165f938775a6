"""A load generator that needs nothing beyond tfservo's install: closed and open loop, over
HTTP/1.1 keep-alive connections (the standard library's http.client) or gRPC (grpcio, with
requests serialized once beforehand).

Closed loop: `concurrency` clients, each sending its next request when the last is answered
(what a fixed pool of callers does; throughput then says what the server sustains). Open loop:
requests scheduled at Poisson arrivals of `rate` per second, and each latency counted from
its scheduled time, not from when a free client got to it, so a server that falls behind shows
it in the latency instead of slowing the arrivals (no coordinated omission).

Each client is a thread: the generator's CPU is what Python spends per request (about 60 µs
for HTTP), reported with the result (`load_cores`) because it shares the machine with the
server being measured.
"""

from __future__ import annotations

import http.client
import random
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

__all__ = ["GrpcTarget", "HttpTarget", "LoadResult", "Target", "closed_loop", "open_loop"]


@dataclass(frozen=True)
class HttpTarget:
    """POST `body` to `path` on host:port with `headers`; 2xx is a success."""

    host: str
    port: int
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def client(self) -> Callable[[], bool]:
        """One client's send: a keep-alive connection of its own, reopened after an error."""
        conn: list[http.client.HTTPConnection] = []
        headers = {"Content-Type": "application/json", **self.headers, "Content-Length": str(len(self.body))}

        def send() -> bool:
            if not conn:
                conn.append(http.client.HTTPConnection(self.host, self.port, timeout=120))
            try:
                conn[0].request("POST", self.path, self.body, headers)
                response = conn[0].getresponse()
                response.read()
                return 200 <= response.status < 300
            except (OSError, http.client.HTTPException):
                conn.pop().close()
                return False

        return send


@dataclass(frozen=True)
class GrpcTarget:
    """Call the unary `method` on host:port with the serialized request `body`."""

    host: str
    port: int
    method: str
    body: bytes
    _channel: list[Any] = field(default_factory=list, compare=False, repr=False)

    def client(self) -> Callable[[], bool]:
        import grpc

        if not self._channel:  # one channel (one HTTP/2 connection) shared by the clients, as a gRPC client does
            options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
            self._channel.append(grpc.insecure_channel(f"{self.host}:{self.port}", options=options))
        call = self._channel[0].unary_unary(
            self.method, request_serializer=lambda b: b, response_deserializer=lambda b: b,
        )

        def send() -> bool:
            try:
                call(self.body, timeout=120)
                return True
            except grpc.RpcError:
                return False

        return send

    def close(self) -> None:
        for channel in self._channel:
            channel.close()
        self._channel.clear()


Target = HttpTarget | GrpcTarget


@dataclass(frozen=True)
class LoadResult:
    """What one run measured: successes' latencies (s), errors, and the time and CPU it took."""

    mode: str  # "closed" or "open"
    level: float  # clients (closed) or offered requests per second (open)
    latencies: np.ndarray
    errors: int
    seconds: float
    load_cores: float  # the generator's own CPU over the run, in cores
    lag: np.ndarray = field(default_factory=lambda: np.zeros(0))  # open loop: how late each request was sent (s)

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds > 0 else 0.0

    def quantile_ms(self, q: float) -> float:
        return float(np.quantile(self.latencies, q) * 1e3) if len(self.latencies) else float("inf")

    @property
    def lag_p99_ms(self) -> float:
        """How late the generator itself sent its requests (open loop; 0 for closed loop)."""
        return float(np.quantile(self.lag, 0.99) * 1e3) if len(self.lag) else 0.0

    @property
    def p50_ms(self) -> float:
        return self.quantile_ms(0.5)

    @property
    def p99_ms(self) -> float:
        return self.quantile_ms(0.99)

    def summary(self) -> dict[str, float]:
        return {"level": self.level, "rps": round(self.rps, 2), "p50_ms": round(self.p50_ms, 3),
                "p99_ms": round(self.p99_ms, 3), "errors": self.errors, "requests": len(self.latencies),
                "load_cores": round(self.load_cores, 3), "send_lag_p99_ms": round(self.lag_p99_ms, 3)}


def closed_loop(target: Target, concurrency: int, seconds: float, warmup: float = 0.3) -> LoadResult:
    """`concurrency` clients back to back for `warmup` + `seconds`; only the last `seconds` count."""
    start = time.perf_counter() + warmup
    stop = start + seconds
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency

    def client(i: int) -> None:
        send = target.client()
        mine, now = latencies[i], time.perf_counter
        while True:
            t0 = now()
            if t0 >= stop:
                return
            ok = send()
            t1 = now()
            if t0 >= start:
                if ok:
                    mine.append(t1 - t0)
                else:
                    errors[i] += 1

    cpu0 = _cpu()
    _run_threads(client, concurrency)
    return _result("closed", concurrency, latencies, errors, seconds, cpu0, warmup)


def open_loop(target: Target, rate: float, seconds: float, clients: int = 64, warmup: float = 0.3,
              seed: int = 0) -> LoadResult:
    """Poisson arrivals at `rate`/s for `warmup` + `seconds`, sent by up to `clients` at a time;
    each latency runs from the request's scheduled arrival."""
    rng = random.Random(seed)
    begin = time.perf_counter() + 0.05
    arrivals: list[float] = []
    t = begin
    while t < begin + warmup + seconds:
        arrivals.append(t)
        t += rng.expovariate(rate)
    start = begin + warmup
    next_index = [0]
    lock = threading.Lock()
    latencies: list[list[float]] = [[] for _ in range(clients)]
    lags: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients

    def client(i: int) -> None:
        send = target.client()
        mine, late, now = latencies[i], lags[i], time.perf_counter
        while True:
            with lock:
                k = next_index[0]
                if k >= len(arrivals):
                    return
                next_index[0] = k + 1
            due = arrivals[k]
            wait = due - now()
            if wait > 0:
                time.sleep(wait)
            elif due >= start:
                late.append(-wait)
            ok = send()
            if due >= start:
                if ok:
                    mine.append(now() - due)
                else:
                    errors[i] += 1

    cpu0 = _cpu()
    _run_threads(client, clients)
    result = _result("open", rate, latencies, errors, seconds, cpu0, warmup)
    sent_late = np.fromiter((x for per in lags for x in per), dtype=np.float64)
    on_time = max(0, sum(len(per) for per in latencies) + sum(errors) - len(sent_late))
    return replace(result, lag=np.concatenate([sent_late, np.zeros(on_time)]))


def _run_threads(fn: Callable[[int], None], n: int) -> None:
    threads = [threading.Thread(target=fn, args=(i,), name=f"tfservo-tune-load-{i}", daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, time.perf_counter()


def _result(mode: str, level: float, latencies: list[list[float]], errors: list[int], seconds: float,
            cpu0: tuple[float, float], warmup: float) -> LoadResult:
    cpu1 = _cpu()
    wall = max(cpu1[1] - cpu0[1], 1e-9)
    flat = np.fromiter((x for per in latencies for x in per), dtype=np.float64)
    return LoadResult(mode, level, flat, sum(errors), seconds, (cpu1[0] - cpu0[0]) / wall)
