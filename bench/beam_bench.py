"""Beam RunInference benchmark: the same model and data through every way of running it.

    .venv/bin/python bench/beam_bench.py                 # ~5 minutes; writes bench/results/beam.json
    .venv/bin/python bench/beam_bench.py --records 2000  # quicker

The model is a small MLP (64 → 128 relu → 10) built from code with fixed weights, with two
signatures: `serving_default` (x: float32[None, 64]) and `examples` (serialized tf.Examples with
a 64-float feature x, the only input tfx-bsl accepts). Every run uses the DirectRunner
in-process on the same N records and is timed end to end (pipeline start, model load,
inference, results collected), beside raw in-process calls of the same signature:

- raw_tf_signature:    tf.saved_model.load(...).signatures["serving_default"] on batches of --batch
- raw_tfservo_runtime: tfservo's LoadedModel.run on batches of --batch (what the handler calls)
- beam_floor:          Create → Map(identity) → Count: the DirectRunner's own cost per record
- tfservo_*:           RunInference(BundleModelHandler(...)), arrays or tf.Examples
- beam_tf_handler*:    Beam's TFModelHandlerNumpy (in bench/.venv-tfxbsl, which has tensorflow_hub)
- tfx_bsl:             tfx-bsl's RunInference on tf.Examples (bench/.venv-tfxbsl: its pins clash
                       with ours: tensorflow-serving-api<2.20, absl-py<2)

The venv is created with uv on first use (~1 minute, downloads TensorFlow); --skip-venv skips
those runs. Numbers are for this machine only; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
VENV = BENCH / ".venv-tfxbsl"
VENV_PY = VENV / "bin" / "python"
VENV_PACKAGES = ["tfx-bsl==1.21.0", "tensorflow-hub==0.16.1", "setuptools<81"]  # hub imports pkg_resources
FEATURES, HIDDEN, CLASSES = 64, 128, 10

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


# -- model and data ------------------------------------------------------------------------------


def build_model(bundle: Path) -> Path:
    """Save the MLP as bundle/00000001 (both signatures, plus __call__ for Keras-style callers)."""
    import numpy as np
    import tensorflow as tf

    version = bundle / "00000001"
    if (version / "saved_model.pb").is_file():
        return bundle
    rng = np.random.default_rng(7)

    class MLP(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1 = tf.Variable(rng.normal(size=(FEATURES, HIDDEN)).astype("float32") / 8)
            self.b1 = tf.Variable(np.zeros(HIDDEN, "float32"))
            self.w2 = tf.Variable(rng.normal(size=(HIDDEN, CLASSES)).astype("float32") / 11)
            self.b2 = tf.Variable(np.zeros(CLASSES, "float32"))

        def _forward(self, x):
            return tf.nn.relu(x @ self.w1 + self.b1) @ self.w2 + self.b2

        @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
        def __call__(self, x):
            return self._forward(x)

        @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
        def serve(self, x):
            return {"y": self._forward(x)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def examples(self, serialized):
            spec = {"x": tf.io.FixedLenFeature([FEATURES], tf.float32)}
            return {"y": self._forward(tf.io.parse_example(serialized, spec)["x"])}

    module = MLP()
    tf.saved_model.save(
        module, str(version), signatures={"serving_default": module.serve, "examples": module.examples}
    )
    return bundle


def make_data(n: int):
    import numpy as np

    return np.random.default_rng(11).normal(size=(n, FEATURES)).astype("float32")


def to_examples(data):
    import tensorflow as tf

    return [
        tf.train.Example(
            features=tf.train.Features(
                feature={"x": tf.train.Feature(float_list=tf.train.FloatList(value=row))}
            )
        )
        for row in data
    ]


# -- runs ------------------------------------------------------------------------------------------


REPEATS = 3


def timed(name: str, fn, records: int, **notes) -> dict:
    """Run fn() REPEATS times (the machine is shared: report best and median); failures are results too."""
    samples, extra = [], {}
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        try:
            extra = fn() or {}
        except Exception as exc:
            line = f"{type(exc).__name__}: {exc}".strip().splitlines()
            return {"name": name, "ok": False, "error": " ".join(line)[:600], **notes}
        samples.append(time.perf_counter() - t0)
    best, median = min(samples), statistics.median(samples)
    return {
        "name": name,
        "ok": True,
        "seconds": round(best, 3),
        "median_seconds": round(median, 3),
        "records_per_s": round(records / best, 1),
        "samples": [round(x, 3) for x in samples],
        **notes,
        **extra,
    }


def raw_tf_signature(version_dir: Path, data, batch: int) -> dict:
    import tensorflow as tf

    t0 = time.perf_counter()
    fn = tf.saved_model.load(str(version_dir)).signatures["serving_default"]
    load = time.perf_counter() - t0
    t1 = time.perf_counter()
    for i in range(0, len(data), batch):
        fn(x=tf.constant(data[i : i + batch]))["y"].numpy()
    return {"load_seconds": round(load, 3), "inference_seconds": round(time.perf_counter() - t1, 3)}


def raw_tfservo_runtime(version_dir: Path, data, batch: int) -> dict:
    from tfservo.models.savedmodel import load_saved_model

    t0 = time.perf_counter()
    model = load_saved_model(str(version_dir))
    load = time.perf_counter() - t0
    t1 = time.perf_counter()
    for i in range(0, len(data), batch):
        model.run("serving_default", {"x": data[i : i + batch]})
    return {"load_seconds": round(load, 3), "inference_seconds": round(time.perf_counter() - t1, 3)}


CHUNK = 500


class _Rows:
    """Emits rows [start, start+CHUNK) of data.npy as arrays or tf.Examples, inside the pipeline.

    beam.Create pickles every element (~0.6 ms for a numpy row or an Example here), which would
    swamp what is measured; producing them in the pipeline keeps that cost out of every run.
    """

    def __init__(self, path: str, kind: str) -> None:
        self.path, self.kind, self.data = path, kind, None

    def __call__(self, start: int):
        import numpy as np

        if self.data is None:
            self.data = np.load(self.path)
        rows = self.data[start : start + CHUNK]
        return list(rows) if self.kind == "arrays" else to_examples(rows)


def _count(pcoll_fn, data_path: Path, kind: str, records: int) -> dict:
    """Generate `records` elements → pcoll_fn → count outputs (checked against the input)."""
    import apache_beam as beam

    with beam.Pipeline() as p:
        source = p | beam.Create(list(range(0, records, CHUNK))) | beam.FlatMap(_Rows(str(data_path), kind))
        counted = pcoll_fn(source) | "Count" >> beam.combiners.Count.Globally()
        counted | "Check" >> beam.Map(_check_count, records)
    return {}


def _check_count(got: int, want: int) -> None:
    if got != want:
        raise AssertionError(f"pipeline produced {got} results for {want} records")


def warm_up() -> dict:
    """The first pipeline in a process pays Beam's one-time start-up; keep it out of the others."""
    import apache_beam as beam

    with beam.Pipeline() as p:
        p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x)
    return {}


def beam_floor(data_path: Path, kind: str, records: int) -> dict:
    import apache_beam as beam

    return _count(lambda pc: pc | beam.Map(lambda x: x), data_path, kind, records)


def tfservo_handler(bundle: Path, data_path: Path, kind: str, records: int, **options) -> dict:
    from apache_beam.ml.inference.base import RunInference

    from tfservo.beam import BundleModelHandler

    handler = BundleModelHandler(str(bundle), **options)
    return _count(lambda pc: pc | RunInference(handler), data_path, kind, records)


def beam_tf_handler(version_dir: Path, data_path: Path, records: int) -> dict:
    """Beam's own handler; run in the bench venv (it needs tensorflow_hub)."""
    from apache_beam.ml.inference.base import RunInference
    from apache_beam.ml.inference.tensorflow_inference import TFModelHandlerNumpy

    handler = TFModelHandlerNumpy(str(version_dir))
    handler.load_model()  # fail fast and clearly if it cannot load the model at all
    return _count(lambda pc: pc | RunInference(handler), data_path, "arrays", records)


def run_tfx_bsl(version_dir: Path, data_path: Path, records: int) -> dict:
    from tfx_bsl.public.beam import RunInference
    from tfx_bsl.public.proto import model_spec_pb2

    spec = model_spec_pb2.InferenceSpecType(
        saved_model_spec=model_spec_pb2.SavedModelSpec(
            model_path=str(version_dir), signature_name=["examples"]
        )
    )
    return _count(lambda pc: pc | RunInference(spec), data_path, "examples", records)


# -- orchestration -----------------------------------------------------------------------------


def ensure_venv() -> str | None:
    """Create bench/.venv-tfxbsl if missing; None when ready, else why it is not."""
    if VENV_PY.exists():
        return None
    uv = REPO / ".venv" / "bin" / "uv"
    if not uv.exists():
        packages = " ".join(VENV_PACKAGES)
        return f"{uv} not found; create {VENV} by hand: python3.11 -m venv {VENV} && {VENV_PY} -m pip install {packages}"
    print(f"creating {VENV} ({', '.join(VENV_PACKAGES)}) ...", file=sys.stderr)
    for cmd in (
        [str(uv), "venv", str(VENV), "--python", sys.executable],
        [str(uv), "pip", "install", "--python", str(VENV_PY), *VENV_PACKAGES],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            return f"{' '.join(cmd[:3])} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    return None


def venv_run(which: str, work: Path, records: int) -> dict:
    """Run one venv-only case in a child process of the bench venv; its JSON result."""
    cmd = [
        str(VENV_PY),
        __file__,
        "--worker",
        which,
        "--work",
        str(work),
        "--records",
        str(records),
        "--repeats",
        str(REPEATS),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {
            "name": which,
            "ok": False,
            "error": f"worker exited {done.returncode}: {done.stderr.strip()[-600:]}",
        }
    return json.loads(lines[-1])


def worker(which: str, work: Path, records: int) -> dict:
    """One venv-only case; imports happen before the clock starts."""
    legacy = which == "beam_tf_handler_legacy_keras"
    if legacy:
        os.environ["TF_USE_LEGACY_KERAS"] = "1"  # must precede the TensorFlow import
    import tensorflow  # noqa: F401 - imported before the clock starts

    version_dir, data_path = work / "mlp" / "00000001", work / "data.npy"
    warm_up()
    if which == "tfx_bsl":
        import tfx_bsl.public.beam  # noqa: F401

        return timed(
            "tfx_bsl",
            lambda: run_tfx_bsl(version_dir, data_path, records),
            records,
            input="tf.train.Example",
            batching="tfx-bsl's own (BatchElements defaults)",
            output="PredictionLog",
        )
    import apache_beam.ml.inference.tensorflow_inference  # noqa: F401

    return timed(
        which,
        lambda: beam_tf_handler(version_dir, data_path, records),
        records,
        input="numpy float32[64]",
        batching="BatchElements defaults",
        keras="tf-keras 2 (TF_USE_LEGACY_KERAS=1)" if legacy else "Keras 3 (default)",
    )


def environment() -> dict:
    import apache_beam
    import tensorflow as tf

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "apache_beam": apache_beam.__version__,
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "runner": "DirectRunner (in-process FnApiRunner)",
    }


def main() -> None:
    global REPEATS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10000)
    parser.add_argument("--batch", type=int, default=256, help="batch size for raw calls and tfservo_*_batch")
    parser.add_argument("--work", type=Path, default=BENCH / "work" / "beam")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "beam.json")
    parser.add_argument(
        "--repeats", type=int, default=REPEATS, help="runs of each case (best and median reported)"
    )
    parser.add_argument("--skip-venv", action="store_true", help="skip Beam's TF handler and tfx-bsl")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    REPEATS = args.repeats
    if args.worker:
        print(json.dumps(worker(args.worker, args.work, args.records)))
        return

    import numpy as np

    load_start = os.getloadavg()
    args.work.mkdir(parents=True, exist_ok=True)
    bundle = build_model(args.work / "mlp")
    version = bundle / "00000001"
    data = make_data(args.records)
    data_path = args.work / "data.npy"
    np.save(data_path, data)
    n, b = args.records, args.batch
    t0 = time.perf_counter()
    warm_up()
    first = {
        "name": "beam_warm_up",
        "ok": True,
        "seconds": round(time.perf_counter() - t0, 3),
        "note": "first pipeline in the process (3 records): Beam's one-time start-up, not repeated",
    }
    runs = [
        first,
        timed("raw_tf_signature", lambda: raw_tf_signature(version, data, b), n, batch=b, beam=False),
        timed("raw_tfservo_runtime", lambda: raw_tfservo_runtime(version, data, b), n, batch=b, beam=False),
        timed(
            "beam_floor_arrays",
            lambda: beam_floor(data_path, "arrays", n),
            n,
            note="no model: rows generated in the pipeline → Map(identity) → Count",
        ),
        timed(
            "beam_floor_examples",
            lambda: beam_floor(data_path, "examples", n),
            n,
            note="no model: tf.Examples built in the pipeline → Map(identity) → Count",
        ),
        timed(
            "tfservo_arrays",
            lambda: tfservo_handler(bundle, data_path, "arrays", n),
            n,
            input="numpy float32[64]",
            batching="BatchElements defaults",
        ),
        timed(
            "tfservo_arrays_batch",
            lambda: tfservo_handler(bundle, data_path, "arrays", n, min_batch_size=b, max_batch_size=b),
            n,
            input="numpy float32[64]",
            batching=f"min=max={b}",
        ),
        timed(
            "tfservo_examples_prediction_log",
            lambda: tfservo_handler(
                bundle, data_path, "examples", n, signature_name="examples", output="prediction_log"
            ),
            n,
            input="tf.train.Example",
            batching="BatchElements defaults",
            output="PredictionLog",
        ),
    ]
    if args.skip_venv:
        runs.append({"name": "bench venv", "ok": False, "error": "skipped (--skip-venv)"})
    elif (why := ensure_venv()) is not None:
        runs.append({"name": "bench venv", "ok": False, "error": why})
    else:
        for which in ("beam_tf_handler", "beam_tf_handler_legacy_keras", "tfx_bsl"):
            runs.append(venv_run(which, args.work, n))

    doc = {
        "benchmark": "beam",
        "records": n,
        "batch": b,
        "repeats": REPEATS,
        "load_average_at_start": load_start,
        "model": f"MLP {FEATURES}-{HIDDEN}-{CLASSES} float32",
        "environment": environment(),
        "runs": runs,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{'run':34} {'best s':>8} {'median s':>8} {'records/s':>10}")
    for r in runs:
        if r.get("ok") and "median_seconds" not in r:
            print(f"{r['name']:34} {r['seconds']:8.2f}")
        elif r.get("ok"):
            print(f"{r['name']:34} {r['seconds']:8.2f} {r['median_seconds']:8.2f} {r['records_per_s']:10.0f}")
        else:
            print(f"{r['name']:34} {'failed':>8}  {r.get('error', '')[:150]}")
    print(f"wrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}")


if __name__ == "__main__":
    main()
