"""Keras 3 on JAX against Keras 3 on TensorFlow, and against what tfservo serves (issue 63, item 3):
the same `.keras` files (bench/keras_bench.py's MLP and CNN) called through Keras's compiled
predict step (`predict_on_batch`: jax.jit on JAX, tf.function on TensorFlow) at 1 and 32 rows,
each backend in its own process, beside tfservo's own call of the exported SavedModel
(`LoadedModel.run`, the session fast path every door uses), and the least a JAX server would
run, one `jax.jit` of the model's `stateless_call` with its variables passed in. Median µs per call
over 2,000 calls after 200 warm-up calls.

JAX is not one of tfservo's dependencies: run this with a Python that has jax, keras and
tensorflow (the TF figures come from the repository's .venv):

    python bench/keras_jax_bench.py WORKDIR RESULTS --jax-python /path/to/venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CALLS, WARM = 2000, 200
ROWS = (1, 32)

_KERAS_CALLS = r"""
import json, os, statistics, sys, time
import numpy as np
import keras
out = {}
for name in ("mlp", "cnn"):
    model = keras.saving.load_model(os.path.join(sys.argv[1], name, "1", "model.keras"), compile=False)
    shape = tuple(model.inputs[0].shape[1:]) if model.inputs else ((64,) if name == "mlp" else (28, 28, 1))
    for rows in (1, 32):
        x = np.random.default_rng(0).standard_normal((rows, *shape)).astype("float32")
        for _ in range(int(sys.argv[3])):
            model.predict_on_batch(x)
        seconds = []
        for _ in range(int(sys.argv[2])):
            t = time.perf_counter(); model.predict_on_batch(x); seconds.append(time.perf_counter() - t)
        out[f"{name} {rows}"] = statistics.median(seconds) * 1e6
        if keras.config.backend() == "jax":  # the least a JAX server would run: one jitted stateless call
            import jax
            tv = [v.value for v in model.trainable_variables]
            ntv = [v.value for v in model.non_trainable_variables]
            fn = jax.jit(lambda tv, ntv, x: model.stateless_call(tv, ntv, x, training=False)[0])
            for _ in range(int(sys.argv[3])):
                fn(tv, ntv, x).block_until_ready()
            seconds = []
            for _ in range(int(sys.argv[2])):
                t = time.perf_counter(); np.asarray(fn(tv, ntv, x)); seconds.append(time.perf_counter() - t)
            out[f"{name} {rows} jit"] = statistics.median(seconds) * 1e6
print("RESULT " + json.dumps({"backend": keras.config.backend(), "us": out}))
"""


def keras_calls(python: str, keras_root: Path, backend: str) -> dict[str, float]:
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([python, "-c", _KERAS_CALLS, str(keras_root), str(CALLS), str(WARM)], env=env,
                          capture_output=True, text=True, timeout=900, check=True)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert result["backend"] == backend, result
    return {k: float(v) for k, v in result["us"].items()}


def tfservo_calls(saved_root: Path) -> dict[str, float]:
    from tfservo.models.savedmodel import load_saved_model

    out = {}
    for name in ("mlp", "cnn"):
        model = load_saved_model(str(saved_root / name / "1"))
        spec = next(iter(model.signatures["serving_default"].inputs.values()))
        for rows in ROWS:
            x = np.random.default_rng(0).standard_normal((rows, *spec.shape[1:])).astype("float32")
            inputs = {spec.key: x}
            for _ in range(WARM):
                model.run("serving_default", inputs)
            seconds = []
            for _ in range(CALLS):
                started = time.perf_counter()
                model.run("serving_default", inputs)
                seconds.append(time.perf_counter() - started)
            out[f"{name} {rows}"] = statistics.median(seconds) * 1e6
    return out


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from keras_bench import build_keras, export_all
    from report import save_section

    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("results")
    parser.add_argument("--jax-python", required=True)
    args = parser.parse_args()
    root = Path(args.workdir) / "keras-jax-bench"
    if not (root / "saved" / "cnn" / "1" / "saved_model.pb").exists():
        build_keras(root)
        export_all(root)
    on_tf = keras_calls(sys.executable, root / "keras", "tensorflow")
    on_jax = keras_calls(args.jax_python, root / "keras", "jax")
    served = tfservo_calls(root / "saved")
    rows = []
    for key in on_tf:
        jit = on_jax[f"{key} jit"]
        rows.append({"model, rows": key, "Keras predict_on_batch on TF µs": round(on_tf[key], 1),
                     "Keras predict_on_batch on JAX µs": round(on_jax[key], 1),
                     "jax.jit(stateless_call) µs": round(jit, 1), "tfservo LoadedModel.run (TF) µs": round(served[key], 1),
                     "jit time / tfservo's": f"{jit / served[key]:.2f}×"})
    save_section(args.results, "keras_jax", {
        "title": "Keras 3 on JAX against TensorFlow and tfservo's call (`bench/keras_jax_bench.py`)",
        "rows": rows,
        "notes": [f"Median µs per call of {CALLS} after {WARM} warm-up calls, each backend in its own process, "
                  "one after another on the same cores; JAX on CPU (jax and jaxlib from PyPI, not tfservo's "
                  "dependencies). tfservo serves .keras files on TensorFlow: see docs/decisions.md."],
    })


if __name__ == "__main__":
    main()
