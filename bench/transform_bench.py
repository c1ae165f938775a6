"""Batch transform of a folder of JPEGs through the ResNet-50 b64 bundle, three ways:

- raw in-process: TF decodes each JPEG and the session callable runs the signature (batch 1,
  ResNet-50's best here; see ceiling.json) — the ceiling;
- `tfservo transform MODEL IN OUT --content-type image/jpeg` — each file one /invocations
  request through code/inference.py, as SageMaker batch transform would send it;
- Beam RunInference on the DirectRunner with tfservo's BundleModelHandler over the same raw
  JPEG bytes (content_type="image/jpeg": the same inference.py path).

The two end-to-end ways are timed as commands (process start and model load included), over
N images and over 1 image; (N − 1) / (T_N − T_1) is their steady images/s. Writes
RESULTS/transform.json in the report's section format.

Usage: python bench/transform_bench.py WORKDIR RESULTS [--quick]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
TFSERVO = REPO / ".venv" / "bin" / "tfservo"

BEAM_PIPELINE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference
    from apache_beam.options.pipeline_options import PipelineOptions
    from tfservo.beam import BundleModelHandler

    bundle, folder, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    paths = sorted(str(p) for p in Path(folder).glob("*.jpg"))[:n]
    handler = BundleModelHandler(bundle, content_type="image/jpeg")
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as p:
        done = (
            p
            | beam.Create(paths)
            | beam.Map(lambda path: Path(path).read_bytes())
            | RunInference(handler)
            | beam.combiners.Count.Globally()
        )
        done | beam.Map(lambda count: print("BEAM_COUNT", count, flush=True))
    """
)


def make_jpegs(folder: Path, n: int) -> list[Path]:
    from models import synthetic_jpeg

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = folder / f"image-{i:04d}.jpg"
        if not path.exists():
            path.write_bytes(synthetic_jpeg(1000 + i))
        paths.append(path)
    return paths


def raw_in_process(bundle_version: Path, paths: list[Path]) -> dict:
    """Decode + model call per image in this process, after loading (load time reported apart)."""
    from tfservo.core.logs import quiet_tensorflow

    quiet_tensorflow()
    import numpy as np
    import tensorflow as tf

    from tfservo.models.savedmodel import load_saved_model

    t0 = time.perf_counter()
    model = load_saved_model(str(bundle_version))
    load_s = time.perf_counter() - t0
    first = tf.io.decode_jpeg(paths[0].read_bytes(), channels=3).numpy()[None].astype(np.float32)
    model.run("serving_default", {"images": first})  # the first call of a shape builds kernels
    t0 = time.perf_counter()
    for path in paths:
        pixels = tf.io.decode_jpeg(path.read_bytes(), channels=3).numpy()[None].astype(np.float32)
        model.run("serving_default", {"images": pixels})
    seconds = time.perf_counter() - t0
    model.close()
    return {"load_s": load_s, "seconds": seconds, "images_per_s": len(paths) / seconds}


def timed(command: list[str], env: dict | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} … failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds, done.stdout


def transform_run(bundle: Path, folder: Path, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    seconds, _ = timed([str(TFSERVO), "transform", str(bundle), str(folder), str(out), "--content-type", "image/jpeg"])
    answers = sorted(out.glob("*.out"))
    expected = len(list(folder.glob("*.jpg")))
    if len(answers) != expected:
        raise RuntimeError(f"tfservo transform wrote {len(answers)} outputs for {expected} JPEGs in {folder}")
    first = json.loads(answers[0].read_text())
    if len(first["predictions"][0]) != 1000:
        raise RuntimeError(f"unexpected transform output in {answers[0]}")
    return seconds


def beam_run(bundle: Path, folder: Path, n: int) -> float:
    seconds, stdout = timed([str(PYTHON), "-c", BEAM_PIPELINE, str(bundle), str(folder), str(n)],
                            env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    if f"BEAM_COUNT {n}" not in stdout:
        raise RuntimeError(f"Beam pipeline did not count {n} results: {stdout[-500:]}")
    return seconds


def main(workdir: Path, results: Path, quick: bool) -> dict:
    n = 40 if quick else 150
    bundle = workdir / "models" / "resnet50"
    folder, one = workdir / "transform" / f"jpegs-{n}", workdir / "transform" / "jpegs-1"
    paths = make_jpegs(folder, n)
    make_jpegs(one, 1)
    print(f"transform bench: {n} JPEGs in {folder}", flush=True)
    raw = raw_in_process(bundle / "1", paths)
    print(f"  raw in-process: {raw['images_per_s']:.2f} images/s", flush=True)
    t_n = transform_run(bundle, folder, workdir / "transform" / "out-n")
    t_1 = transform_run(bundle, one, workdir / "transform" / "out-1")
    print(f"  tfservo transform: {t_n:.1f} s for {n}, {t_1:.1f} s for 1", flush=True)
    b_n = beam_run(bundle, folder, n)
    b_1 = beam_run(bundle, one, 1)
    print(f"  Beam RunInference: {b_n:.1f} s for {n}, {b_1:.1f} s for 1", flush=True)

    def row(name: str, total: float | None, steady: float, note: str) -> dict:
        return {
            "way": name,
            f"seconds for {n} images": f"{total:.1f}" if total is not None else "–",
            "images/s end to end": f"{n / total:.2f}" if total else "–",
            "images/s steady": f"{steady:.2f}",
            "× raw": f"{steady / raw['images_per_s']:.2f}×",
            "includes": note,
        }

    doc = {
        "title": f"Batch transform: {n} JPEGs (224×224) through the ResNet-50 b64 bundle",
        "rows": [
            row("raw in-process (decode + session call, batch 1)", None, raw["images_per_s"],
                f"model load {raw['load_s']:.1f} s not counted"),
            row("`tfservo transform --content-type image/jpeg`", t_n, (n - 1) / max(t_n - t_1, 1e-9),
                f"process start + load: {t_1:.1f} s for 1 image"),
            row("Beam RunInference, DirectRunner, BundleModelHandler", b_n, (n - 1) / max(b_n - b_1, 1e-9),
                f"pipeline start + load: {b_1:.1f} s for 1 image"),
        ],
        "notes": [
            "Steady images/s = (N − 1) / (T_N − T_1): the end-to-end time of N images minus that of one "
            "image (process start, model load, pipeline set-up). Both end-to-end ways send each JPEG "
            "through code/inference.py, which decodes it and hands the pixels to TF Serving's predict "
            "as a numpy array, in-process (bench/transform_bench.py; machine as above).",
        ],
    }
    (results / "transform.json").write_text(json.dumps(doc, indent=1))
    return doc


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), "--quick" in sys.argv)
