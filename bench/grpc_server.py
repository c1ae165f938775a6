"""gRPC serving choices, measured: grpc's sync server vs grpc.aio, and TensorProto conversion cost.

    python bench/grpc_server.py convert                   # TensorProto ⇄ numpy, µs per call
    python bench/grpc_server.py compare MODEL_DIR NAME    # sync vs aio server, closed-loop load

`compare` runs each server variant in its own process pinned to CPU 0 (taskset) and a
grpc.aio load client pinned to CPU 1, at several concurrencies, with a batch-1 Predict of
`x` float32[1, 1] (protocol overhead dominates) and a batch-32 one of float32[32, 784] when
NAME's input is 784 wide (e.g. bench/work/models/mlp from bench/models.py).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SECONDS = 8.0


def _timeit(fn, n: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def convert() -> None:
    import tensorflow as tf
    from tensorflow.core.framework import tensor_pb2

    from tfservo.codecs.tensor_proto import to_ndarray, to_tensor_proto

    for shape in [(1, 1), (32, 784), (32, 1000)]:
        a = np.random.default_rng(0).random(shape, dtype=np.float32)
        typed = to_tensor_proto(a)
        assert np.array_equal(to_ndarray(typed), a)

        def protobuf_extend() -> None:
            p = tensor_pb2.TensorProto(dtype=1)
            p.float_val.extend(a.reshape(-1).tolist())

        n = 2000 if a.size < 100 else 100
        print(
            f"float32{list(shape)}: encode typed fast {_timeit(lambda: to_tensor_proto(a), n):8.1f} µs | "
            f"float_val.extend(tolist) {_timeit(protobuf_extend, n):8.1f} µs | "
            f"tf.make_tensor_proto {_timeit(lambda: tf.make_tensor_proto(a), n):8.1f} µs"
        )
        print(
            f"{'':>{len(str(list(shape))) + 9}} decode typed fast {_timeit(lambda: to_ndarray(typed), n):8.1f} µs | "
            f"np.array(float_val) {_timeit(lambda: np.array(typed.float_val, np.float32), n):8.1f} µs | "
            f"tf.make_ndarray {_timeit(lambda: tf.make_ndarray(typed), n):8.1f} µs"
        )


# -- servers ---------------------------------------------------------------------------------


def _service(model_dir: str):
    from tfservo.core.service import ModelService

    service = ModelService()
    service.add_bundle(model_dir)
    return service


def serve_sync(model_dir: str, port: int) -> None:
    import threading

    from tfservo.grpc.tfserving import GrpcServer

    GrpcServer(_service(model_dir).api, port=port).start()
    print("ready", flush=True)
    threading.Event().wait()  # until terminated


def serve_aio(model_dir: str, port: int) -> None:
    """The same servicer logic on grpc.aio, model calls in a thread pool (as REST does)."""
    import concurrent.futures

    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    from tfservo.grpc.tfserving import PredictionServicer

    logic = PredictionServicer(_service(model_dir).api)
    pool = concurrent.futures.ThreadPoolExecutor(64)

    class AioServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
        async def Predict(self, request, context):
            return await asyncio.get_running_loop().run_in_executor(pool, logic.predict, request)

    async def main() -> None:
        server = grpc.aio.server()
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(AioServicer(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


# -- client ----------------------------------------------------------------------------------


def load(target: str, name: str, rows: int, width: int, concurrency: int, seconds: float) -> None:
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones((rows, width), np.float32)))

    async def main() -> None:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            for _ in range(20):
                await stub.Predict(request)
            latencies: list[float] = []
            stop = time.perf_counter() + seconds

            async def loop() -> None:
                while time.perf_counter() < stop:
                    t0 = time.perf_counter()
                    await stub.Predict(request)
                    latencies.append(time.perf_counter() - t0)

            await asyncio.gather(*(loop() for _ in range(concurrency)))
            lat = sorted(latencies)
            print(
                f"{len(lat) / seconds:8.0f} req/s  p50 {statistics.median(lat) * 1e3:6.2f} ms  "
                f"p99 {lat[int(len(lat) * 0.99)] * 1e3:6.2f} ms",
                flush=True,
            )

    asyncio.run(main())


def compare(model_dir: str, name: str) -> None:
    width = 784 if name == "mlp" else 1
    rows = 32 if width == 784 else 1
    me = [sys.executable, os.path.abspath(__file__)]
    for variant in ("sync", "aio"):
        port = 19000 + (variant == "aio")
        server = subprocess.Popen(
            ["taskset", "-c", "0", *me, f"serve-{variant}", model_dir, str(port)],
            stdout=subprocess.PIPE, text=True,
        )
        try:
            assert server.stdout and server.stdout.readline().strip() == "ready"
            for concurrency in (1, 8, 32):
                out = subprocess.run(
                    ["taskset", "-c", "1", *me, "load", f"127.0.0.1:{port}", name, str(rows), str(width),
                     str(concurrency), str(SECONDS)],
                    capture_output=True, text=True, check=True,
                ).stdout.strip()
                print(f"{variant:4} {name} x[{rows},{width}] concurrency {concurrency:3}: {out}", flush=True)
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "convert":
        convert()
    elif cmd == "compare":
        compare(*args)
    elif cmd == "serve-sync":
        serve_sync(args[0], int(args[1]))
    elif cmd == "serve-aio":
        serve_aio(args[0], int(args[1]))
    elif cmd == "load":
        load(args[0], args[1], int(args[2]), int(args[3]), int(args[4]), float(args[5]))
    else:
        raise SystemExit(__doc__)
