"""gRPC beside its floor: tfservo's TF Serving Predict and KServe V2 ModelInfer against a
do-nothing server on the same gRPC stack (grpc.aio on a uvloop event loop, as tfservo's), which
parses each request and answers tfservo's own answer bytes — and against the same do-nothing
servicer on grpcio's thread-pool server (the other stack grpcio offers, tfservo's before). The
load client sends the requests' bytes on grpc.aio, pinned to the load core as wrk is.

    python bench/grpc_floor.py WORK RESULTS [--quick]       # writes RESULTS/grpc.json
    python bench/grpc_floor.py floor PORT ANSWERS.json [sync]   # the do-nothing server (aio; sync: thread pool)
    python bench/grpc_floor.py load ADDRESS METHOD SECONDS CONCURRENCY   # JSON on stdout

WORK is bench/models.py's folder (WORK/models/mlp: a 784-256-256-10 MLP, input `x`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent import futures
from pathlib import Path

import numpy as np
from load import load_core
from report import save_section
from servers import TFSERVO, free_port

CONCURRENCY = 32
# method: (service, rpc) on the wire
METHODS = {
    "predict": ("tensorflow.serving.PredictionService", "Predict"),
    "v2": ("inference.GRPCInferenceService", "ModelInfer"),
}


def requests() -> dict[str, bytes]:
    """One MLP row as TF Serving's PredictRequest and as KServe V2's ModelInferRequest."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2
    from tritonclient.grpc import service_pb2

    row = np.random.default_rng(0).random((1, 784), dtype=np.float32)
    predict = predict_pb2.PredictRequest()
    predict.model_spec.name = "mlp"
    predict.inputs["x"].CopyFrom(tf.make_tensor_proto(row))
    infer = service_pb2.ModelInferRequest(model_name="mlp")
    tensor = infer.inputs.add(name="x", datatype="FP32")
    tensor.shape.extend(row.shape)
    infer.raw_input_contents.append(row.tobytes())
    return {"predict": predict.SerializeToString(), "v2": infer.SerializeToString()}


def _parsers() -> dict[str, object]:
    from tensorflow_serving.apis import predict_pb2
    from tritonclient.grpc import service_pb2

    return {"predict": predict_pb2.PredictRequest.FromString, "v2": service_pb2.ModelInferRequest.FromString}


def _floor_handlers(answers_file: str, asynchronous: bool) -> list[object]:
    """A handler per service answering every call with fixed bytes, after parsing the request."""
    import grpc

    answers = {k: base64.b64decode(v) for k, v in json.loads(Path(answers_file).read_text()).items()}
    parsers = _parsers()
    handlers = []
    for method, (service, rpc) in METHODS.items():
        answer = answers[method]

        async def answer_async(request: object, context: object, answer: bytes = answer) -> bytes:
            return answer

        def answer_sync(request: object, context: object, answer: bytes = answer) -> bytes:
            return answer

        handler = grpc.unary_unary_rpc_method_handler(
            answer_async if asynchronous else answer_sync, request_deserializer=parsers[method],  # type: ignore[arg-type]
        )
        handlers.append(grpc.method_handlers_generic_handler(service, {rpc: handler}))
    return handlers


def serve_floor(port: int, answers_file: str, sync: bool) -> None:
    """The do-nothing server: grpc.aio on uvloop (tfservo's stack), or grpcio's thread-pool server."""
    import grpc

    if sync:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
        server.add_generic_rpc_handlers(_floor_handlers(answers_file, False))
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        server.wait_for_termination()
        return
    import uvloop

    async def serve() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(_floor_handlers(answers_file, True))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    uvloop.run(serve())


async def _load(address: str, method: str, seconds: float, concurrency: int) -> dict:
    import grpc

    service, rpc = METHODS[method]
    body = requests()[method]
    latencies: list[float] = []
    errors = 0
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/{service}/{rpc}")  # bytes in, bytes out: the client parses nothing
        await call(body)
        deadline = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal errors
            while (t0 := time.perf_counter()) < deadline:
                try:
                    await call(body)
                except grpc.aio.AioRpcError:
                    errors += 1
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {"rps": len(latencies) / elapsed, "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))], "errors": errors}


def load(address: str, method: str, seconds: float, concurrency: int) -> dict:
    """The load client in its own process on the load core."""
    done = subprocess.run(
        ["taskset", "-c", str(load_core()), sys.executable, __file__, "load", address, method, str(seconds), str(concurrency)],
        capture_output=True, text=True, check=True, cwd=Path(__file__).parent,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _wait(check: object, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} did not start within {timeout:.0f} s")


def measure(work: Path, results: Path, quick: bool) -> dict:
    import grpc

    seconds = 5.0 if quick else 15.0
    http, grpc_port, floor_port, sync_port = free_port(), free_port(), free_port(), free_port()
    env = {**os.environ, "TFSERVO_TF_LOGS": "0", "TF_CPP_MIN_LOG_LEVEL": "3"}
    logs = results / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    tfservo = subprocess.Popen(
        [str(TFSERVO), "serve", str(work / "models" / "mlp"), "--host", "127.0.0.1", "--port", str(http),
         "--grpc-port", str(grpc_port), "--log-level", "warning"],
        stdout=open(logs / "grpc-tfservo.log", "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    floors: list[subprocess.Popen[bytes]] = []
    rows = []
    try:
        _wait(lambda: urllib.request.urlopen(f"http://127.0.0.1:{http}/ping", timeout=2).status == 200, "tfservo")
        bodies = requests()
        answers = {}
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            for method, (service, rpc) in METHODS.items():
                answers[method] = base64.b64encode(channel.unary_unary(f"/{service}/{rpc}")(bodies[method], timeout=30)).decode()
        answers_file = work / "grpc-floor-answers.json"
        answers_file.write_text(json.dumps(answers))
        for port, kind in ((floor_port, "aio"), (sync_port, "sync")):
            floors.append(subprocess.Popen([sys.executable, __file__, "floor", str(port), str(answers_file), kind],
                                           cwd=Path(__file__).parent, stdout=open(logs / f"grpc-floor-{kind}.log", "wb"),
                                           stderr=subprocess.STDOUT, start_new_session=True))
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
                _wait(lambda: call(bodies["predict"], timeout=2) is not None, f"the gRPC floor ({kind})")
        floor, sync_floor = "floor: do-nothing grpc.aio server (uvloop)", "do-nothing grpcio thread-pool server"
        for method, label in (("predict", "TF Serving Predict"), ("v2", "KServe V2 ModelInfer")):
            measured: dict[str, dict] = {}
            for server, port in ((floor, floor_port), (sync_floor, sync_port), ("tfservo defaults", grpc_port)):
                load(f"127.0.0.1:{port}", method, 2.0, CONCURRENCY)  # warm-up
                measured[server] = load(f"127.0.0.1:{port}", method, seconds, CONCURRENCY)
            floor_rps, sync_rps = measured[floor]["rps"], measured[sync_floor]["rps"]
            for server, m in measured.items():
                rows.append({"call": label, "server": server, "concurrency": CONCURRENCY, "req/s": f"{m['rps']:,.0f}",
                             "× floor": f"{m['rps'] / floor_rps:.2f}×", "× thread-pool floor": f"{m['rps'] / sync_rps:.2f}×",
                             "p50 ms": f"{m['p50_ms']:.2f}", "p99 ms": f"{m['p99_ms']:.2f}", "errors": m["errors"]})
            mine = measured["tfservo defaults"]["rps"]
            print(f"grpc {label}: tfservo {mine:.0f} req/s = {mine / floor_rps:.2f}× the floor ({floor_rps:.0f}), "
                  f"{mine / sync_rps:.2f}× the thread-pool floor ({sync_rps:.0f})", flush=True)
    finally:
        for proc in (tfservo, *floors):
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    doc = {
        "title": "gRPC: tfservo beside a do-nothing server on the same gRPC stack (bench/grpc_floor.py)",
        "rows": rows,
        "notes": [
            f"MLP 784-256-256-10, one 1×784 float32 row per call, {CONCURRENCY} concurrent calls on one grpc.aio "
            f"channel pinned to the load core, {seconds:g} s after a 2 s warm-up. The floors parse each request "
            "(PredictRequest / ModelInferRequest) and answer the bytes tfservo answered to the same request: "
            "on grpc.aio with uvloop, tfservo's stack ('× floor'), and on grpcio's thread-pool server.",
            "Issue 28's target: tfservo's gRPC Predict at ≥ 50 % of the floor.",
        ],
    }
    save_section(results, "grpc", doc)
    return doc


def main() -> None:
    if sys.argv[1] == "floor":
        serve_floor(int(sys.argv[2]), sys.argv[3], sys.argv[4:] == ["sync"])
    elif sys.argv[1] == "load":
        print(json.dumps(asyncio.run(_load(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])))))
    else:
        measure(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), "--quick" in sys.argv[3:])


if __name__ == "__main__":
    main()
