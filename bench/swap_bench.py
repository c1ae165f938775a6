"""A model swap under steady streaming load (issue 26): Beam's DirectRunner in streaming mode,
PeriodicImpulse firing RATE elements/s of the MLP (one 784-float row each) into
RunInference(BundleModelHandler(bundle, file_system_poll_wait_seconds=0.5)); SWAP_AT seconds in,
version 2 lands in the bundle (copied beside it, then renamed into place, as a retrain would)
and takes over while the stream runs.

For each element: the time it was due (its impulse timestamp), the time its answer came out of
RunInference, and the model id that answered. Measured: the rate reached, every element
answered exactly once, the wait (answer − due) before the swap (what one batch costs in this
pipeline), around the swap, and after; version 2's load time from tfservo's own log line. The
issue's bound: no element waits more than the new model's load time plus one batch.

    python bench/swap_bench.py WORK RESULTS [--quick]     # writes RESULTS/swap.json
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

RATE = 500
SWAP_AT = 10.0
LOADED = re.compile(r"model (\S+) version (\d+) AVAILABLE .*\(([0-9.]+)s\)")


class _Loads(logging.Handler):
    """tfservo's 'model … version N AVAILABLE … (Ns)' lines: each version's load seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[int, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        found = LOADED.search(record.getMessage())
        if found:
            self.seconds[int(found[2])] = float(found[3])


class _Record:
    """Appends (due, answered, model id) of each answer to a file (the DoFn runs in this process)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, result: object) -> None:
        example, model_id = result.example, result.model_id  # type: ignore[attr-defined]
        with open(self.path, "a") as f:
            f.write(f"{float(example[0])!r} {time.time()!r} {model_id}\n")


def measure(work: Path, quick: bool) -> dict:
    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.transforms.periodicsequence import PeriodicImpulse
    from models import build_all

    from tfservo.beam import BundleModelHandler

    models = build_all(work)
    root = work / "swap"
    shutil.rmtree(root, ignore_errors=True)
    bundle = root / "mlp"
    shutil.copytree(models["mlp_version"], bundle / "1")
    out = root / "answers.txt"
    seconds = 20.0 if quick else 40.0
    loads = _Loads()
    logging.getLogger("tfservo.models").addHandler(loads)
    logging.getLogger("tfservo.models").setLevel(logging.INFO)

    start = time.time() + 15  # the pipeline's own start-up and the first load come before
    landed: list[float] = []

    def land() -> None:
        time.sleep(max(start + SWAP_AT - time.time(), 0))
        shutil.copytree(bundle / "1", root / ".incoming")
        (root / ".incoming").rename(bundle / "2")
        landed.append(time.time())

    lander = threading.Thread(target=land, daemon=True)
    lander.start()
    row = np.random.default_rng(1).random(784, dtype=np.float32)

    def element(t: object) -> np.ndarray:
        x = row.copy()
        x[0] = float(t) - start  # type: ignore[arg-type]  # seconds after start: the answer names its element
        return x

    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    handler = BundleModelHandler(str(bundle), file_system_poll_wait_seconds=0.5)
    with beam.Pipeline(options=options) as p:
        _ = (p
             | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + seconds, fire_interval=1 / RATE)
             | beam.Map(element)
             | RunInference(handler)
             | beam.Map(_Record(str(out))))
    lander.join()
    return summarize(out, landed[0] if landed else None, loads.seconds, start, seconds)


def summarize(out: Path, landed: float | None, loads: dict[int, float], start: float, seconds: float) -> dict:
    rows = [line.split() for line in out.read_text().splitlines()]
    due = start + np.array([float(r[0]) for r in rows])  # float32 seconds after start: microseconds exact
    answered = np.array([float(r[1]) for r in rows])
    models = [r[2] for r in rows]
    expected = int(round(seconds * RATE))
    grid = np.round((due - start) * RATE)
    unique = len(set(grid.tolist()))
    wait = answered - due
    first_v2 = min((a for a, m in zip(answered, models) if m.endswith("/2")), default=None)
    before = wait[answered < (landed or np.inf)]
    around = wait[(answered >= (landed or np.inf)) & (answered <= (first_v2 or -np.inf) + 5)]
    after = wait[answered > (first_v2 or np.inf) + 5]
    one_batch = float(np.percentile(before, 99)) if len(before) else float("nan")
    load = loads.get(2)
    worst = float(around.max()) if len(around) else float("nan")
    return {
        "elements due": expected,
        "answers": len(rows),
        "distinct elements answered": unique,
        "answered by version 1": sum(1 for m in models if m.endswith("/1")),
        "answered by version 2": sum(1 for m in models if m.endswith("/2")),
        "rate reached (answers/s)": len(rows) / (answered.max() - answered.min()) if len(rows) > 1 else 0.0,
        "version 2 landed → first answer (s)": (first_v2 - landed) if first_v2 and landed else None,
        "version 2 load (s, tfservo's log)": load,
        "wait before the swap p50/p99/max (s)": _pcts(before),
        "wait around the swap p50/p99/max (s)": _pcts(around),
        "wait after p50/p99/max (s)": _pcts(after),
        "bound: load + one batch (s)": (load + one_batch) if load is not None else None,
        "worst wait around the swap (s)": worst,
        "met": bool(load is not None and worst <= load + one_batch and unique == len(rows) == expected),
    }


def _pcts(values: np.ndarray) -> list[float] | None:
    if not len(values):
        return None
    return [round(float(np.percentile(values, q)), 4) for q in (50, 99)] + [round(float(values.max()), 4)]


def main() -> None:
    work, results = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    stats = measure(work, "--quick" in sys.argv)
    for key, value in stats.items():
        print(f"{key}: {value}")
    fmt = (lambda v: ", ".join(f"{x:.3f}" for x in v) if isinstance(v, list)
           else f"{v:.3f}" if isinstance(v, float) else str(v))
    doc = {
        "title": f"A model swap under streaming load: Beam DirectRunner (streaming), {RATE} MLP elements/s, version 2 lands at {SWAP_AT:g} s",
        "rows": [{"measure": key, "value": fmt(value)} for key, value in stats.items()],
        "notes": [
            "PeriodicImpulse → RunInference(BundleModelHandler(bundle, file_system_poll_wait_seconds=0.5)); "
            "wait = when the answer left RunInference − when the element was due. 'One batch' is the 99th "
            "percentile wait before the swap. Issue 26's bound: no element waits more than version 2's load "
            "time plus one batch; every element answered once (bench/swap_bench.py).",
            "Python DirectRunner, this machine (2 cores), one run.",
        ],
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / "swap.json").write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
