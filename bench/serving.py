"""The serving benchmark: every server configuration, every workload, one after another.

For each server: start it, check one answer per workload against the in-process reference,
warm it up, then run wrk at each concurrency for a fixed time. Results (one JSON document with
every run and the machine's facts) go to OUT.

Usage: python bench/serving.py WORKDIR CEILING.json OUT.json [--quick] [--only SUBSTRING]...
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
import servers
from load import first_output, load_core, post, run_wrk

# Batching settings for tfservo "batching on" and PyTriton's dynamic batcher, per model.
# Requests carry one row, so batches fill from concurrency: up to 32 rows for the MLP, up to
# the 8 concurrent clients for ResNet-50 (whose per-image cost drops with batch size on an idle
# machine, see ceiling.json).
BATCHING = {
    "mlp": {"max_batch_size": 32, "batch_timeout_micros": 500, "num_batch_threads": 2, "max_enqueued_batches": 64},
    "resnet": {"max_batch_size": 8, "batch_timeout_micros": 5000, "num_batch_threads": 2, "max_enqueued_batches": 64},
}
WORKLOADS = {
    # workload: (model, concurrency levels, seconds per run, warm-up seconds)
    "mlp": ("mlp", [1, 32], 15.0, 3.0),
    "resnet_b64": ("resnet", [8], 20.0, 5.0),
    "resnet_float": ("resnet", [8], 20.0, 5.0),
}


def server_configs(model: str, paths: dict[str, str], answers: Path) -> list[servers.Server]:
    bundle = paths["mlp" if model == "mlp" else "resnet50"]
    version = paths["mlp_version" if model == "mlp" else "resnet50_version"]
    batching = BATCHING[model]
    return [
        servers.floor(model, answers),
        servers.floor(model, answers, stack="tfservo"),
        servers.floor(model, answers, stack="granian"),
        servers.floor(model, answers, stack="lean"),
        servers.tfservo_defaults(model, bundle),
        servers.tfservo(model, bundle, batching=None, workers=1),
        servers.tfservo(model, bundle, batching=batching, workers=1),
        servers.tfservo(model, bundle, batching=None, workers=2),
        servers.tfservo(model, bundle, batching=batching, workers=2),
        servers.tfservo(model, bundle, batching={**batching, "eager": True}, workers=2),
        servers.pytriton(
            model, version, max_batch_size=batching["max_batch_size"],
            queue_delay_micros=batching["batch_timeout_micros"],
        ),
        servers.kserve(model, version),
        servers.fastapi(model, version),
    ]


def _cpuinfo() -> tuple[str, bool]:
    """The processor's model name and whether it has AVX-512."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "unknown")
    return model, " avx512f " in info


def cpu() -> str:
    """The processor the figures were measured on, as the name that tells this machine's hosts
    apart: the same "AMD EPYC" comes with AVX-512 or without, and TensorFlow's kernels run
    several times faster with it while the HTTP stack runs alike. Rows are only compared with a
    ceiling measured on the same."""
    model, avx512 = _cpuinfo()
    return cpu_name(model, os.cpu_count() or 0, avx512)


def cpu_name(model: str, cores: int, avx512: bool) -> str:
    """How rows, ceilings and machine facts name a CPU (cpu())."""
    return f"{model}, {cores} cores, {'with' if avx512 else 'without'} AVX-512"


def machine_facts() -> dict:
    cpu_model, avx512 = _cpuinfo()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    def version_of(python: Path, module: str) -> str | None:
        if not python.exists():
            return None
        done = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version('{module}'))"],
                              capture_output=True, text=True)
        return done.stdout.strip() or None

    wrk = subprocess.run(["wrk", "--version"], capture_output=True, text=True)
    return {
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "avx512": avx512,
        "cpu": cpu(),
        "memory_gib": round(mem_gib, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "tensorflow": version_of(servers.REPO / ".venv/bin/python", "tensorflow"),
        "numpy": np.__version__,
        "tfservo": version_of(servers.REPO / ".venv/bin/python", "tfservo"),
        "nvidia-pytriton": version_of(servers.peer_python("pytriton"), "nvidia-pytriton"),
        "kserve": version_of(servers.peer_python("kserve"), "kserve"),
        "fastapi": version_of(servers.peer_python("fastapi"), "fastapi"),
        "load_tool": (wrk.stdout or wrk.stderr).splitlines()[0] if (wrk.stdout or wrk.stderr) else "wrk",
        "pinning": f"wrk: 1 thread, pinned to core {load_core()} (taskset); servers and the ceiling: unpinned",
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
    }


def check_answer(server: servers.Server, workload: str, body: bytes, reference: list[float]) -> float:
    """POST one request; the answer must match the in-process reference. Returns the max abs diff."""
    ep = server.endpoints[workload]
    status, answer = post(server.base_url + ep.path, body)
    if status != 200:
        raise RuntimeError(f"{server.name} answered {status} on {workload}: {answer[:500]!r}")
    got = first_output(ep.protocol, answer)
    ref = np.asarray(reference)
    if got.shape != ref.shape:
        raise RuntimeError(f"{server.name} answered shape {got.shape} on {workload}, expected {ref.shape}")
    return float(np.max(np.abs(got - ref)))


def run(workdir: Path, ceiling: dict, out: Path, *, quick: bool, only: list[str]) -> dict:
    from models import build_all

    paths = build_all(workdir)
    bodies = workdir / "bodies"
    doc = {"machine": machine_facts(), "batching": BATCHING, "workloads": {}, "runs": []}
    for name, (model, levels, secs, warm) in WORKLOADS.items():
        doc["workloads"][name] = {"model": model, "concurrency": levels, "seconds": secs / (3 if quick else 1)}
    for model in ("mlp", "resnet"):
        answers = servers.floor_answers(workdir, model, ceiling[model]["reference_output"])
        for server in server_configs(model, paths, answers):
            label = f"{model}: {server.name}"
            if only and not any(o in label for o in only):
                continue
            print(f"== {label}", flush=True)
            t0 = time.monotonic()
            try:
                server.start(out.parent / "logs")
            except RuntimeError as exc:
                print(f"   could not start: {exc}", flush=True)
                doc["runs"].append({"server": server.name, "family": server.family, "model": model, "failed": str(exc)})
                continue
            started = time.monotonic() - t0
            try:
                for workload, (wl_model, levels, secs, warm) in WORKLOADS.items():
                    if wl_model != model:
                        continue
                    ep = server.endpoints[workload]
                    body_path = bodies / ep.body
                    diff = check_answer(server, workload, body_path.read_bytes(), ceiling[model]["reference_output"])
                    url = server.base_url + ep.path
                    run_wrk(url, str(body_path), connections=max(levels), seconds=warm / (3 if quick else 1),
                            server_pid=server.proc.pid)
                    for c in levels:
                        result = run_wrk(url, str(body_path), connections=c, seconds=secs / (3 if quick else 1),
                                         server_pid=server.proc.pid)
                        record = {
                            "server": server.name, "family": server.family, "model": model,
                            "workload": workload, "concurrency": c, "settings": server.settings,
                            "start_seconds": round(started, 1), "answer_max_abs_diff": diff,
                            "cpu": doc["machine"]["cpu"],
                            **result,
                        }
                        doc["runs"].append(record)
                        print(
                            f"   {workload} c={c}: {result['rps']:.1f} req/s, p50 {result['p50_ms']:.2f} ms, "
                            f"p99 {result['p99_ms']:.2f} ms, errors {result['errors']}, server "
                            f"{result['server_cores']:.2f} cores, other {result['other_cores']:.2f}",
                            flush=True,
                        )
            except RuntimeError as exc:
                print(f"   failed: {exc}", flush=True)
                doc["runs"].append({"server": server.name, "family": server.family, "model": model, "failed": str(exc)})
            finally:
                server.stop()
    doc["machine"]["loadavg_at_end"] = Path("/proc/loadavg").read_text().split()[:3]
    if only and out.exists():
        # A partial rerun replaces its own runs in the last full results and keeps the rest.
        previous = json.loads(out.read_text())
        fresh: dict[tuple, list[dict]] = {}
        for r in doc["runs"]:
            fresh.setdefault((r["model"], r["server"]), []).append(r)
        runs: list[dict] = []
        for r in previous["runs"]:
            key = (r["model"], r["server"])
            if key not in fresh:
                runs.append(r)
            elif fresh[key]:  # the new runs take the place of the first old one
                runs.extend(fresh.pop(key))
                fresh[key] = []
        runs.extend(r for rs in fresh.values() for r in rs)
        doc = {**previous, "runs": runs}
        doc.setdefault("reruns", []).append({"only": only, "machine": machine_facts()})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("ceiling", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--quick", action="store_true", help="runs a third as long (a smoke test)")
    parser.add_argument("--only", action="append", default=[], help="run only servers whose 'model: name' holds this")
    args = parser.parse_args()
    ceiling = json.loads(args.ceiling.read_text())
    doc = run(args.workdir.resolve(), ceiling, args.out, quick=args.quick, only=args.only)
    from report import targets

    print("\n".join(["", "targets (docs/performance.md):", *targets(doc["runs"], ceiling)]), flush=True)


if __name__ == "__main__":
    main()
