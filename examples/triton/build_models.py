"""Build, from code, the models Triton's Python client examples call, as TensorFlow SavedModels
with Triton's tensor names (`python examples/triton/build_models.py ROOT`).

`simple` (INT32 INPUT0, INPUT1 [-1, 16] → OUTPUT0 = sum, OUTPUT1 = difference), `simple_int8`
and `simple_string` (the same on INT8 and on decimal strings), `simple_identity` (BYTES in, the
same out) and `custom_identity_int32`; `simple_fp32`, `simple_fp64` and `simple_int64` round the
repository up to the eight models Triton's example repository holds (its model-control example
counts them). Each is version 1 under ROOT/NAME/1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from tfservo.core.logs import quiet_tensorflow

quiet_tensorflow()

import tensorflow as tf  # noqa: E402

__all__ = ["MODELS", "build_triton_models"]


def _sum_and_difference(dtype: tf.DType) -> tf.Module:
    class SumAndDifference(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 16], dtype, name="INPUT0"),
                                      tf.TensorSpec([None, 16], dtype, name="INPUT1")])
        def serve(self, a: tf.Tensor, b: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"OUTPUT0": a + b, "OUTPUT1": a - b}

    return SumAndDifference()


def _string_sum_and_difference() -> tf.Module:
    class StringSumAndDifference(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.string, name="INPUT0"),
                                      tf.TensorSpec([None, 16], tf.string, name="INPUT1")])
        def serve(self, a: tf.Tensor, b: tf.Tensor) -> dict[str, tf.Tensor]:
            x = tf.strings.to_number(a, tf.int32)
            y = tf.strings.to_number(b, tf.int32)
            return {"OUTPUT0": tf.strings.as_string(x + y), "OUTPUT1": tf.strings.as_string(x - y)}

    return StringSumAndDifference()


def _identity(dtype: tf.DType) -> tf.Module:
    class Identity(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None], dtype, name="INPUT0")])
        def serve(self, a: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"OUTPUT0": tf.identity(a)}

    return Identity()


MODELS: dict[str, Callable[[], tf.Module]] = {
    "simple": lambda: _sum_and_difference(tf.int32),
    "simple_int8": lambda: _sum_and_difference(tf.int8),
    "simple_string": _string_sum_and_difference,
    "simple_identity": lambda: _identity(tf.string),
    "custom_identity_int32": lambda: _identity(tf.int32),
    "simple_fp32": lambda: _sum_and_difference(tf.float32),
    "simple_fp64": lambda: _sum_and_difference(tf.float64),
    "simple_int64": lambda: _sum_and_difference(tf.int64),
}


def build_triton_models(root: str, names: list[str] | None = None) -> list[str]:
    """Save each model (all of MODELS unless `names`) as version 1 under `root`; their paths."""
    paths = []
    for name in names or list(MODELS):
        module = MODELS[name]()
        path = os.path.join(root, name, "1")
        tf.saved_model.save(module, path, signatures={"serving_default": module.serve.get_concrete_function()})
        paths.append(path)
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/triton/build_models.py ROOT")
    for built in build_triton_models(sys.argv[1]):
        print(built)
