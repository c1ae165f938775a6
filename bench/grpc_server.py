"""TensorProto conversion cost, measured (the servers themselves: bench/grpc_floor.py).

    python bench/grpc_server.py convert                   # TensorProto ⇄ numpy, µs per call
"""

from __future__ import annotations

import sys
import time

import numpy as np


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


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "convert":
        convert()
    else:
        raise SystemExit(__doc__)
