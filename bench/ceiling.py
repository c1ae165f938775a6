"""The ceiling: raw in-process calls of the same signature, no server, at the best batch size.

Three call paths are measured and the fastest one is the ceiling: a TF session callable (what
tfservo's runtime uses) with TensorFlow's default threads, the same with one intra-op thread
(what each of tfservo's workers gets when the defaults start one per core), and
`tf.saved_model.load(...).signatures["serving_default"]` (TF's documented TF2 path). Also the
batch-1 latency of the fastest path there (the concurrency-1 reference) and each workload's
reference answer, which every server's answer is checked against.

A process's intra-op thread pool is made with its first session and shared by every session
after it, so the one-thread path runs in a process of its own (`--alone`).

Usage: python bench/ceiling.py WORKDIR OUT.json [--quick] [--model=mlp|resnet]...
       python bench/ceiling.py --alone PATH MODEL WORKDIR SECONDS [BATCH]...   (one path, in a
           process of its own, as JSON: session_callable, session_callable_1_thread, tf2_signature)
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

BATCHES = {"mlp": [1, 8, 32, 64, 128, 256], "resnet": [1, 2, 4, 8]}
SECONDS = {"mlp": 1.0, "resnet": 4.0}


def _time_calls(fn: Callable[[], object], seconds: float, min_calls: int = 3) -> list[float]:
    fn()
    fn()  # warm: first calls of a shape build kernels
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < min_calls:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def measure(call: Callable[[np.ndarray], np.ndarray], make: Callable[[int], np.ndarray], batches: list[int],
            seconds: float, *, batch1: bool = True) -> dict:
    """Rows/s at each batch size (and the batch-1 call's latency, unless `batch1` is False)."""
    rows = {}
    for b in batches:
        x = make(b)
        call(x)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        times = _time_calls(lambda: call(x), seconds)
        cores = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        rows[str(b)] = {
            "calls": len(times),
            "ms_per_call_p50": round(float(np.median(times)) * 1e3, 4),
            "rows_per_s": round(b * len(times) / sum(times), 2),
            "cpu_cores": round(cores, 3),
            "rows_per_cpu_s": round(b * len(times) / sum(times) / max(cores, 1e-9), 2),
        }
    best = max(rows, key=lambda b: rows[b]["rows_per_s"])
    out = {"by_batch": rows, "best_batch": int(best), "best_rows_per_s": rows[best]["rows_per_s"]}
    if batch1:
        single = _time_calls(lambda: call(make(1)), seconds, min_calls=20)
        out["batch1_p50_ms"] = round(float(np.percentile(single, 50)) * 1e3, 4)
        out["batch1_p99_ms"] = round(float(np.percentile(single, 99)) * 1e3, 4)
    return out


def keep_best(old: dict, new: dict) -> dict:
    """The higher of two ceiling measurements on the same CPU (a ceiling measured while other
    work ran is low); the other is kept under "other_measurement". One measured on another CPU
    (serving.cpu()) is replaced: rows are compared with the ceiling of the CPU they ran on."""
    if old.get("cpu") != new["cpu"]:
        return new
    best, other = (old, new) if old["ceiling_rows_per_s"] >= new["ceiling_rows_per_s"] else (new, old)
    best = {k: v for k, v in best.items() if k != "other_measurement"}
    best["other_measurement"] = {k: other[k] for k in ("ceiling_rows_per_s", "ceiling_batch", "batch1_p50_ms")}
    return best


def _specs(work: Path) -> dict[str, tuple[Path, str, str, Callable[[int], np.ndarray]]]:
    """Each model's version directory, input and output names, and its batches of `b` rows."""
    from PIL import Image

    bodies = work / "bodies"
    mlp_row = np.asarray(json.loads((bodies / "mlp.tfs.json").read_text())["instances"][0], np.float32)
    pixels = np.asarray(Image.open(io.BytesIO((bodies / "image.jpg").read_bytes())).convert("RGB"), np.float32)
    return {
        "mlp": (work / "models/mlp/1", "x", "probabilities", lambda b: np.tile(mlp_row, (b, 1))),
        "resnet": (work / "models/resnet50/1", "images", "probabilities", lambda b: np.repeat(pixels[None], b, 0)),
    }


_THREADS = {"session_callable": 0, "session_callable_1_thread": 1}  # intra-op threads (0: TensorFlow's choice)


def caller(name: str, path: Path, inp: str, outp: str) -> tuple[Callable[[np.ndarray], np.ndarray], Callable[[], None]]:
    """Call path `name` on the SavedModel version at `path`: its call on a batch, and what releases it."""
    if name == "tf2_signature":
        import tensorflow as tf

        signature = tf.saved_model.load(str(path)).signatures["serving_default"]
        return lambda x: signature(**{inp: tf.constant(x)})[outp].numpy(), lambda: None
    from tfservo.models.savedmodel import load_saved_model

    loaded = load_saved_model(str(path), intra_op_threads=_THREADS[name])
    return lambda x: loaded.run("serving_default", {inp: x})[outp], loaded.close


def path_alone(name: str, model: str, workdir: str, seconds: float, batches: list[int] | None = None) -> dict:
    """One call path's figures, measured in this process, which must have loaded no model yet
    (a process's intra-op pool is its first session's: see the module doc). `batches` other than
    the model's usual ones skip the batch-1 latency."""
    from tfservo.core.logs import quiet_tensorflow

    quiet_tensorflow()
    path, inp, outp, make = _specs(Path(workdir))[model]
    call, close = caller(name, path, inp, outp)
    try:
        return measure(call, make, batches or BATCHES[model], seconds, batch1=batches is None)
    finally:
        close()


def measure_alone(name: str, model: str, workdir: str, seconds: float, batches: list[int] | None = None) -> dict:
    """`path_alone` in a process of its own."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--alone", name, model, workdir, str(seconds),
         *map(str, batches or [])],
        capture_output=True, text=True, check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(workdir: str, out: str, quick: bool = False, only: list[str] | None = None) -> dict:
    from serving import cpu

    from tfservo.core.logs import quiet_tensorflow

    quiet_tensorflow()
    work = Path(workdir)
    scale = 0.3 if quick else 1.0
    specs = _specs(work)
    results: dict = {}
    previous: dict = {}
    if only:  # re-measure some models, keep the others' figures from the last run
        previous = json.loads(Path(out).read_text()) if Path(out).exists() else {}
        results = dict(previous)
        specs = {m: spec for m, spec in specs.items() if m in only}
    for model, (path, inp, outp, make) in specs.items():
        # TensorFlow's default threads: both paths in this process (the first session makes its pool)
        paths = {name: caller(name, path, inp, outp) for name in ("session_callable", "tf2_signature")}
        measured = {name: measure(fn, make, BATCHES[model], SECONDS[model] * scale) for name, (fn, _) in paths.items()}
        measured["session_callable_1_thread"] = measure_alone("session_callable_1_thread", model, str(work),
                                                              SECONDS[model] * scale)
        best_path = max(measured, key=lambda n: measured[n]["best_rows_per_s"])
        fastest_single = min(measured, key=lambda n: measured[n]["batch1_p50_ms"])
        results[model] = {
            "call_paths": measured,
            "ceiling_path": best_path,
            "ceiling_rows_per_s": measured[best_path]["best_rows_per_s"],
            "ceiling_batch": measured[best_path]["best_batch"],
            "ceiling_rows_per_cpu_s": measured[best_path]["by_batch"][str(measured[best_path]["best_batch"])]["rows_per_cpu_s"],
            "ceiling_cpu_cores": measured[best_path]["by_batch"][str(measured[best_path]["best_batch"])]["cpu_cores"],
            "batch1_path": fastest_single,
            "batch1_p50_ms": measured[fastest_single]["batch1_p50_ms"],
            "reference_output": paths["session_callable"][0](make(1))[0].astype(float).tolist(),
            "cpu": cpu(),
        }
        print(
            f"ceiling {model}: {results[model]['ceiling_rows_per_s']:.1f} rows/s at batch "
            f"{results[model]['ceiling_batch']} ({best_path}); batch-1 p50 "
            f"{results[model]['batch1_p50_ms']:.3f} ms ({fastest_single})",
            flush=True,
        )
        if model in previous:
            results[model] = keep_best(previous[model], results[model])
        for _, close in paths.values():
            close()
        del paths
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    if sys.argv[1] == "--alone":
        name, model, workdir, seconds, *batches = sys.argv[2:]
        print(json.dumps(path_alone(name, model, workdir, float(seconds), [int(b) for b in batches] or None)))
        sys.exit(0)
    models = [a.split("=", 1)[1] for a in sys.argv[3:] if a.startswith("--model=")]
    main(sys.argv[1], sys.argv[2], quick="--quick" in sys.argv, only=models or None)
