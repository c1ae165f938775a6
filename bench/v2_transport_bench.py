"""One 224×224×3 float32 image through the V2 door five ways (issue 62): JSON, binary tensors
over REST and gRPC, and Triton's system shared memory over REST and gRPC, with tritonclient,
one client, in interleaved rounds — the client's median latency and the server's CPU per
request (its process tree, from /proc) — beside the cost of compressing answers, which sets
the size from which tfservo compresses a response a client asked to be compressed.

Writes RESULTS/v2_transport.json and RESULTS/response_compression.json (report sections).

Usage: python bench/v2_transport_bench.py WORKDIR RESULTS [--quick]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
from procstat import tree_cpu_seconds
from report import save_section, section_arguments

PYTHON = sys.executable


def build_model(root: Path) -> Path:
    """`mean_rgb`: x float32 [-1, 224, 224, 3] → y, the mean of each channel [-1, 3]."""
    code = (
        "import sys, tensorflow as tf\n"
        "class M(tf.Module):\n"
        "    @tf.function(input_signature=[tf.TensorSpec([None, 224, 224, 3], tf.float32, name='x')])\n"
        "    def serve(self, x):\n"
        "        return {'y': tf.reduce_mean(x, axis=[1, 2])}\n"
        "m = M()\n"
        "tf.saved_model.save(m, sys.argv[1], signatures={'serving_default': m.serve.get_concrete_function()})\n"
    )
    path = root / "mean_rgb" / "1"
    if not path.exists():
        subprocess.run([PYTHON, "-c", code, str(path)], check=True, capture_output=True)
    return path.parent


def serve(model: Path) -> tuple[subprocess.Popen[str], str, str]:
    server = subprocess.Popen([PYTHON, "-m", "tfservo", "serve", str(model), "--port", "0", "--grpc-port", "0",
                               "--workers", "1"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    for line in server.stderr:
        if "serving " in line:
            http = line.split(" on http://", 1)[1].split(" ", 1)[0]
            grpc = line.split(" gRPC on ", 1)[1].split(" ", 1)[0]
            return server, http, grpc
    raise RuntimeError("the server did not start")


def ways(http: str, grpc: str, image: np.ndarray) -> tuple[dict[str, Callable[[], object]], Callable[[], None]]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    rest, rpc = httpclient.InferenceServerClient(http), grpcclient.InferenceServerClient(grpc)
    key = f"/tfservo-bench-{uuid.uuid4().hex[:8]}"
    region = shm.create_shared_memory_region("bench", key, image.nbytes + 64)
    shm.set_shared_memory_region(region, [image])
    for client in (rest, rpc):
        client.unregister_system_shared_memory()
    rest.register_system_shared_memory("bench", key, image.nbytes + 64)

    def call(module: object, client: object, mode: str) -> Callable[[], object]:
        tensor = module.InferInput("x", list(image.shape), "FP32")  # type: ignore[attr-defined]
        output = module.InferRequestedOutput("y")  # type: ignore[attr-defined]
        if mode == "shm":
            tensor.set_shared_memory("bench", image.nbytes)
            output.set_shared_memory("bench", 64, offset=image.nbytes)
        elif module is httpclient:
            tensor.set_data_from_numpy(image, binary_data=mode == "binary")
        else:
            tensor.set_data_from_numpy(image)
        return lambda: client.infer("mean_rgb", [tensor], outputs=[output])  # type: ignore[attr-defined]

    calls = {
        "REST, JSON tensors": call(httpclient, rest, "json"),
        "REST, binary tensors": call(httpclient, rest, "binary"),
        "REST, system shared memory": call(httpclient, rest, "shm"),
        "gRPC, raw_input_contents": call(grpcclient, rpc, "binary"),
        "gRPC, system shared memory": call(grpcclient, rpc, "shm"),
    }

    def close() -> None:
        rest.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(region)
        rest.close()
        rpc.close()

    return calls, close


def transport(work: Path, rounds: int, per_round: int) -> dict[str, object]:
    model = build_model(work)
    image = np.random.default_rng(0).random((1, 224, 224, 3), dtype=np.float32)
    server, http, grpc = serve(model)
    latencies: dict[str, list[float]] = {}
    cpu: dict[str, float] = {}
    try:
        calls, close = ways(http, grpc, image)
        for fn in calls.values():  # warm every path once
            for _ in range(5):
                fn()
        for _ in range(rounds):
            for name, fn in calls.items():
                before = tree_cpu_seconds(server.pid)
                for _ in range(per_round):
                    started = time.perf_counter()
                    fn()
                    latencies.setdefault(name, []).append(time.perf_counter() - started)
                cpu[name] = cpu.get(name, 0.0) + tree_cpu_seconds(server.pid) - before
        close()
    finally:
        server.terminate()
        server.wait(30)
    json_ms = statistics.median(latencies["REST, JSON tensors"]) * 1e3
    rows = []
    for name, seconds in latencies.items():
        median = statistics.median(seconds) * 1e3
        rows.append({"way": name, "median ms": f"{median:.2f}",
                     "p90 ms": f"{sorted(seconds)[int(len(seconds) * 0.9)] * 1e3:.2f}",
                     "server CPU ms / request": f"{cpu[name] / len(seconds) * 1e3:.2f}",
                     "× JSON latency": f"{median / json_ms:.2f}×"})
    return {"title": "One 224×224×3 float32 input (602 KB) through the V2 door (issue 62): tritonclient, one client, "
                     f"{rounds} interleaved rounds of {per_round}",
            "rows": rows,
            "notes": ["Server CPU is the serving process tree's user+system time over the requests of each way "
                      "(/proc; CLK_TCK resolution, so read the larger figures). The model only averages the image, "
                      "so what differs is the transport."]}


def compression(repeats: int) -> dict[str, object]:
    rng = np.random.default_rng(0)
    rows = []
    for n in (2, 8, 32, 128, 1024, 16384):
        body = orjson.dumps({"model_name": "m", "model_version": "1", "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [n], "data": rng.random(n, dtype=np.float32).tolist()}]})
        row: dict[str, object] = {"V2 JSON answer, values": n, "bytes": len(body)}
        for level in (1, 6):
            started = time.perf_counter()
            for _ in range(repeats):
                squeezer = zlib.compressobj(level, zlib.DEFLATED, 31)
                out = squeezer.compress(body) + squeezer.flush()
            micros = (time.perf_counter() - started) / repeats * 1e6
            row[f"gzip {level}: bytes"] = f"{len(out)} ({len(out) / len(body):.2f}×)"
            row[f"gzip {level}: µs"] = f"{micros:.1f}"
        rows.append(row)
    return {"title": "Compressing an answer (issue 62): gzip levels 1 and 6 on V2 JSON answers of growing size",
            "rows": rows,
            "notes": ["tfservo compresses an answer when the client's Accept-Encoding asks for gzip or deflate and "
                      "the answer is at least 1,400 bytes (one TCP segment: below it compression saves no packet), "
                      "at level 1, which keeps ~95 % of level 6's saving for a third to a sixth of its CPU."]}


def main() -> None:
    args = section_arguments()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    rounds, per_round = (3, 20) if args.quick else (5, 60)
    save_section(args.results, "v2_transport", transport(work, rounds, per_round))
    save_section(args.results, "response_compression", compression(20 if args.quick else 100))


if __name__ == "__main__":
    main()
