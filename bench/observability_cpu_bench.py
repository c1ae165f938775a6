"""What seeing every request costs the server, per request (issue 66): the MLP (one JSON
instance on /invocations) and ResNet-50 (a base64 JPEG through code/inference.py) behind
`tfservo serve` with its defaults, driven by wrk at a fixed pace below saturation (half of what
"off" answers flat out), and the server's process tree's CPU seconds — workers, the span-export
and capture children included — divided by its requests. Tracing at 10 % and 100 % sampling,
Data Capture at 100 % (disk), the payload logger and API keys, each against "off" in interleaved
rounds (each round's figure over the same round's "off"); and the floor of capture, a process of
its own writing the same lines at the same rate, its CPU a line. Throughput at saturation is the
other benchmark's (bench/observability_bench.py).

The bounds (issue 66): tracing at 10 % ≤ 1.05× off and at 100 % ≤ 1.30× (MLP; ResNet-50 ≤ 1.01×);
capture's CPU over off ≤ 1.15× the floor's for the same lines (MLP), ≤ 1.02× off (ResNet-50);
API keys ≤ 1.02×.

Writes RESULTS/observability_cpu.json in the report's section format.

Usage: python bench/observability_cpu_bench.py WORKDIR RESULTS [--quick]
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

from load import run_wrk
from models import build_all
from observability_bench import _Receiver, serve, settle
from procstat import tree_cpu_seconds
from report import save_section, section_arguments

from tfservo.auth.keys import add_key

PACED_CONNECTIONS = 4
FLOOR = "floor: capture's lines written at the same rate by a process of their own"
BOUNDS = {"MLP": {"tracing 10%": 1.05, "tracing 100%": 1.30, "API keys": 1.02},
          "ResNet-50": {"tracing 10%": 1.01, "tracing 100%": 1.01, "data capture 100%": 1.02, "API keys": 1.02}}


def paced(url: str, body: str, rate: float, seconds: float, pid: int, authorization: str | None) -> dict[str, float]:
    """wrk at about `rate` requests/s (each of its connections waits between requests); the
    server tree's CPU seconds a request."""
    delay_ms = max(1.0, PACED_CONNECTIONS * 1000 / rate)
    os.environ["BENCH_DELAY_MS"] = f"{delay_ms:.2f}"
    try:
        before = tree_cpu_seconds(pid)
        run = run_wrk(url, body, connections=PACED_CONNECTIONS, seconds=seconds, server_pid=pid,
                      authorization=authorization)
        settle(pid)  # what the server still does for these requests (spans, lines) counts as theirs
        spent = tree_cpu_seconds(pid) - before
    finally:
        os.environ.pop("BENCH_DELAY_MS", None)
    return {"cpu_us": spent / max(run["requests"], 1) * 1e6, "rps": run["rps"], "errors": run["errors"],
            "p50_ms": run["p50_ms"]}


def floor_cpu(rate: float, folder: Path, seconds: float, body: str, answer: Path) -> float:
    """CPU µs a line of bench/capture_floor.py writing `rate` capture lines a second."""
    writer = subprocess.Popen([sys.executable, str(Path(__file__).with_name("capture_floor.py")), str(rate),
                               str(folder), str(seconds), body, str(answer)], stderr=subprocess.PIPE, text=True)
    _, _, usage = os.wait4(writer.pid, 0)
    writer.returncode = 0
    assert writer.stderr is not None
    written = int(writer.stderr.read().split("capture floor: ", 1)[1].split()[0])
    return (usage.ru_utime + usage.ru_stime) / max(written, 1) * 1e6


def measure(label: str, bundle: str, body: str, scratch: Path, receiver_url: str, rounds: int, seconds: float,
            with_floor: bool) -> list[dict[str, object]]:
    config = scratch / f"capture-{label}.json"
    config.write_text(json.dumps({
        "EnableCapture": True, "InitialSamplingPercentage": 100, "DestinationS3Uri": str(scratch / f"captured-{label}"),
        "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
        "CaptureContentTypeHeader": {"JsonContentTypes": ["application/json"]},
    }))
    keys = str(scratch / f"keys-{label}.json")
    key = f"Bearer {add_key(keys, 'bench', ['invoke'])}"
    otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver_url, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    configs: dict[str, tuple[list[str], dict[str, str], str | None]] = {
        "off": ([], {}, None),
        "tracing 10%": ([], {**otlp, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
                        None),
        "tracing 100%": ([], {**otlp, "OTEL_TRACES_SAMPLER": "always_on"}, None),
        "data capture 100%": (["--data-capture-config", str(config)], {}, None),
        "payload log": (["--payload-log-url", receiver_url + "/"], {}, None),
        "API keys": (["--api-keys", keys], {}, key),
    }
    servers = {}
    try:
        for name, (extra, env, _) in configs.items():
            # no poll after each answer: its spin is CPU a paced load pays per request, whatever is observed
            servers[name] = serve(bundle, [*extra, "--idle-poll-us", "0"], scratch / f"server-{label}-{len(servers)}.log",
                                  env)
        url = servers["off"][1] + "/invocations"
        for name, (proc, address) in servers.items():
            run_wrk(address + "/invocations", body, connections=8, seconds=2, server_pid=proc.pid,
                    authorization=configs[name][2])
            settle(proc.pid)
        flat_out = run_wrk(url, body, connections=16, seconds=seconds, server_pid=servers["off"][0].pid)["rps"]
        settle(servers["off"][0].pid)
        rate = flat_out / 2
        answer = scratch / f"answer-{label}.json"
        with urllib.request.urlopen(urllib.request.Request(url, data=Path(body).read_bytes(),
                                                           headers={"Content-Type": "application/json"})) as reply:
            answer.write_bytes(reply.read())
        results: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
        floors: list[float] = []
        names = list(configs)
        for round_ in range(rounds):
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                proc, address = servers[name]
                results[name].append(paced(address + "/invocations", body, rate, seconds, proc.pid, configs[name][2]))
                if "--data-capture-config" in configs[name][0]:
                    os.sync()
            if with_floor:
                (scratch / "floor").mkdir(exist_ok=True)
                floors.append(floor_cpu(rate, scratch / "floor", seconds, body, answer))
                os.sync()
    finally:
        for proc, _ in servers.values():
            os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in servers.values():
            proc.wait(60)
    off = results["off"]
    rows = []
    for name, runs in results.items():
        ratios = [r["cpu_us"] / o["cpu_us"] for r, o in zip(runs, off)]
        extra = [r["cpu_us"] - o["cpu_us"] for r, o in zip(runs, off)]
        row: dict[str, object] = {
            "model": label, "configuration": name,
            "server CPU µs / request (median)": f"{statistics.median(r['cpu_us'] for r in runs):.0f}",
            "× off (median of rounds)": f"{statistics.median(ratios):.3f}×",
            "over off, µs": f"{statistics.median(extra):+.0f}",
            "each round × its off": " ".join(f"{x:.2f}" for x in ratios),
            "paced rate, req/s": f"{statistics.median(r['rps'] for r in runs):.0f}",
            "errors": int(sum(r["errors"] for r in runs)),
        }
        bound = BOUNDS.get(label, {}).get(name)
        if bound is not None:
            row["bound"] = f"≤ {bound:.2f}× off: {'met' if statistics.median(ratios) <= bound else 'missed'}"
        if name == "data capture 100%" and floors:
            floor = statistics.median(floors)
            row["bound"] = (f"over off ≤ 1.15× the floor's {floor:.0f} µs a line: "
                            f"{statistics.median(extra) / floor:.2f}× — "
                            f"{'met' if statistics.median(extra) <= 1.15 * floor else 'missed'}")
        rows.append(row)
    if floors:
        rows.append({"model": label, "configuration": FLOOR,
                     "server CPU µs / request (median)": f"{statistics.median(floors):.0f} (the writer's, a line)"})
    print(f"{label}: flat out {flat_out:.0f} req/s, paced at {rate:.0f}", file=sys.stderr)
    return rows


def main() -> None:
    args = section_arguments()
    rounds, seconds = (3, 4.0) if args.quick else (5, 8.0)
    paths = build_all(args.workdir)
    work = Path(args.workdir).resolve()
    scratch = Path(tempfile.mkdtemp(prefix="tfservo-observability-cpu-", dir=work))
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    receiver_url = f"http://127.0.0.1:{receiver.server_address[1]}"
    try:
        rows = measure("MLP", paths["mlp"], str(work / "bodies" / "mlp.tfs.json"), scratch, receiver_url, rounds,
                       seconds, with_floor=True)
        rows += measure("ResNet-50", paths["resnet50"], str(work / "bodies" / "resnet_b64.tfs.json"), scratch,
                        receiver_url, max(2, rounds - 2), seconds * 1.5, with_floor=False)
    finally:
        receiver.shutdown()
    save_section(args.results, "observability_cpu", {
        "title": "Seeing every request, in server CPU per request (issue 66): a paced load below saturation (wrk's whole-millisecond waits: about a quarter of 'off''s maximum for the MLP)",
        "rows": rows,
        "notes": [
            f"wrk with {PACED_CONNECTIONS} connections, each waiting between requests so that the rate is about half "
            "of what 'off' answers flat out (16 connections); the server's process tree's user+system CPU over each run "
            "and until it is idle again, divided by the run's requests; interleaved rounds, each over its own round's "
            "'off'. Tracing exports OTLP/HTTP to a receiver on loopback; capture writes to a folder on disk; every "
            "server runs with --idle-poll-us 0 (the poll after an answer spins for a while at a paced load, a cost "
            "of the pace, not of what is observed).",
            "The floor row is bench/capture_floor.py writing the same capture lines at the same rate, 16 to a writev: "
            "its own CPU a line, what no capture can spend less than.",
        ],
    })


if __name__ == "__main__":
    main()
