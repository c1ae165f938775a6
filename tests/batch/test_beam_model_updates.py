"""Models replaced while a Beam pipeline runs: RunInference(BundleModelHandler(...),
model_metadata_pcoll=...) fed by explicit events (a side input of ModelMetadata per window), and
new version dirs followed in a running streaming pipeline (file_system_poll_wait_seconds). Each
element is answered by exactly one model, the switch shows in model_id, each bundle's own code/
answers, and a bundle that fails to load is logged while the previous one keeps answering.

WatchFilePattern itself is not tested here: on the Python DirectRunner in streaming mode its
global-window singleton side input fails at the second match ("PCollection of size 2 ... accessed
as a singleton view"), in Beam before any model is loaded; Beam runs its own streaming side-input
test only on Dataflow."""

from __future__ import annotations

import logging
import shutil
import tarfile
import threading
import time
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.ml.inference.base import ModelMetadata, RunInference
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import trigger, window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from beam_models import tfx_example
from conftest import write_code

from tfservo.beam import BundleModelHandler

# Each bundle's handler writes its own tag, so the answer shows which code/ ran, not only which weights.
HANDLER = """
import json

def input_handler(data, context):
    return json.dumps({{"instances": [float(data.read())]}})

def output_handler(response, context):
    y = json.loads(response.content)["predictions"][0]
    return "{tag} " + format(y, "g"), "text/plain"
"""


def _bundle(root: Path, tag: str, factor: float) -> Path:
    """A bundle dir: multiply model (y = factor·x) as `model/00000001`, and code/ tagging answers."""
    build = tfx_example().build_multiply_model
    build(str(root), "model", factor)
    write_code(root / "code", HANDLER.format(tag=tag))
    return root


def _archive(src: Path, dest: Path) -> Path:
    """model.tar.gz of a bundle dir, as SageMaker packs one."""
    with tarfile.open(dest, "w:gz") as tar:
        for item in sorted(src.iterdir()):
            tar.add(item, arcname=item.name)
    return dest


def _broken(root: Path) -> Path:
    """A bundle whose SavedModel is cut short: it cannot load."""
    shutil.copytree(Path(tfx_example().build_multiply_model(str(root / "src"), "model", 1.0)), root / "model")
    pb = root / "model" / "00000001" / "saved_model.pb"
    pb.write_bytes(pb.read_bytes()[:200])
    shutil.rmtree(root / "src")
    return root


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("updates")
    a = _bundle(root / "a", "A", 5.0)
    b = _archive(_bundle(root / "b-src", "B", 10.0), root / "b.tar.gz")
    return {"a": a, "b": b, "broken": _broken(root / "broken")}


def test_explicit_events_switch_models_per_window_and_a_broken_bundle_is_skipped(bundles, caplog) -> None:
    """Windows of 10 s: [0, 10) the handler's own bundle (empty model_id), [10, 20) the archive B,
    [20, 30) a bundle that cannot load (B keeps answering), [30, 40) A again by its path."""
    a, b, broken = str(bundles["a"]), str(bundles["b"]), str(bundles["broken"])
    events = [(1, ""), (11, b), (21, broken), (31, a)]
    elements = [(t, f"{t}".encode()) for t in (2, 5, 12, 18, 22, 28, 32, 38)]

    class _Flatten(beam.DoFn):
        def process(self, grouped):
            yield from grouped[1]

    caplog.set_level(logging.ERROR, logger="tfservo.beam")
    with beam.Pipeline() as p:
        side = (p | "events" >> beam.Create(events)
                | "stamp events" >> beam.Map(lambda e: window.TimestampedValue(ModelMetadata(e[1], e[1] or "a"), e[0]))
                | "event windows" >> beam.WindowInto(window.FixedWindows(10),
                                                     accumulation_mode=trigger.AccumulationMode.DISCARDING)
                | "key events" >> beam.Map(lambda m: ("k", m)) | "group events" >> beam.GroupByKey()
                | "one event" >> beam.ParDo(_Flatten()))
        answers = (p | "elements" >> beam.Create(elements)
                   | "stamp" >> beam.Map(lambda e: window.TimestampedValue(e[1], e[0]))
                   | "windows" >> beam.WindowInto(window.FixedWindows(10))
                   | "key" >> beam.Map(lambda x: ("k", x)) | "group" >> beam.GroupByKey()
                   | "flatten" >> beam.ParDo(_Flatten())
                   | RunInference(BundleModelHandler(a, content_type="text/csv"), model_metadata_pcoll=side)
                   | beam.Map(lambda r: (r.example.decode(), r.inference.decode(), r.model_id)))
        b_id = f"{b}:model/1"
        assert_that(answers, equal_to([
            ("2", "A 10", "model/1"), ("5", "A 25", "model/1"),
            ("12", "B 120", b_id), ("18", "B 180", b_id),
            ("22", "B 220", b_id), ("28", "B 280", b_id),  # the broken bundle did not replace B
            ("32", "A 160", "model/1"), ("38", "A 190", "model/1"),
        ]))
    failures = [r.getMessage() for r in caplog.records if "model update failed" in r.getMessage()]
    assert failures and broken in failures[0] and b in failures[0], failures


def test_a_streaming_pipeline_follows_new_version_dirs_as_they_land(bundles, tmp_path) -> None:
    """file_system_poll_wait_seconds in a running streaming pipeline: version 2 lands mid-stream and
    takes over, then a version 3 that cannot load is skipped; every element is answered once, by
    version 1 or 2, each with its own weights (the bundle's code/ answers for both)."""
    bundle = tmp_path / "bundle"
    shutil.copytree(bundles["a"], bundle)  # model/00000001 (×5) and code/
    build = tfx_example().build_multiply_model
    v2 = Path(build(str(tmp_path / "v2"), "model", 10.0)) / "00000001"
    bad = bundles["broken"] / "model" / "00000001"
    start = time.time()
    stop = start + 30

    def land(src: Path, version: int, after: float) -> None:
        time.sleep(after)
        shutil.copytree(src, bundle / "model" / ".incoming")  # copy, then rename: never half-read
        (bundle / "model" / ".incoming").rename(bundle / "model" / f"{version:08d}")

    lander = threading.Thread(target=lambda: (land(v2, 2, 10), land(bad, 3, 6)), daemon=True)
    lander.start()
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    handler = BundleModelHandler(str(bundle), content_type="text/csv", file_system_poll_wait_seconds=0.5)
    with beam.Pipeline(options=options) as p:
        answers = (p
                   | PeriodicImpulse(start_timestamp=start + 1, stop_timestamp=stop, fire_interval=0.5)
                   | beam.Map(lambda t: f"{round(float(t) - start, 1)}".encode())
                   | RunInference(handler)
                   | beam.Map(lambda r: (r.example.decode(), r.inference.decode(), r.model_id)))

        def check(got):
            xs = [x for x, _, _ in got]
            assert len(xs) == len(set(xs)) and len(xs) >= 40, xs  # each element once, none lost
            assert {m for _, _, m in got} == {"model/1", "model/2"}, got  # 2 took over; 3 never answered
            for x, answer, model_id in got:
                tag, y = answer.split()
                factor = 5.0 if model_id == "model/1" else 10.0
                assert tag == "A" and np.isclose(float(y), factor * float(x), rtol=1e-4), (x, answer, model_id)

        assert_that(answers, check)
    lander.join()


def test_following_new_version_dirs_without_a_side_input(tmp_path) -> None:
    """file_system_poll_wait_seconds: version 2 of the bundle lands while the handler runs."""
    build = tfx_example().build_multiply_model
    bundle = Path(build(str(tmp_path), "model", 5.0))
    handler = BundleModelHandler(str(bundle), file_system_poll_wait_seconds=0.5)
    model = handler.load_model()
    first = list(handler.run_inference([np.float32(2.0)], model))
    assert first[0].model_id == "model/1" and float(first[0].inference["y"]) == 10.0
    other = Path(build(str(tmp_path / "v2"), "model", 10.0))
    shutil.copytree(other / "00000001", bundle / ".incoming")
    (bundle / ".incoming").rename(bundle / "00000002")
    deadline = time.monotonic() + 60
    while True:
        result = list(handler.run_inference([np.float32(2.0)], model))[0]
        if result.model_id == "model/2":
            assert float(result.inference["y"]) == 20.0
            break
        assert time.monotonic() < deadline, "version 2 was not picked up"
        time.sleep(0.5)


def test_events_naming_bundles_on_s3_switch_to_them(bundles, s3_endpoint, s3_bucket, tmp_path) -> None:
    """The same switch with the new bundles on S3 (moto's server): an archive, then a bundle dir
    under a prefix; each is downloaded, loaded with its code/, and named in model_id."""
    from s3_server import upload_dir, upload_file

    archive = upload_file(s3_endpoint, s3_bucket, "updates/b.tar.gz", bundles["b"])
    prefix = upload_dir(s3_endpoint, s3_bucket, "updates/c", _bundle(tmp_path / "c", "C", 3.0))
    events = [(1, archive), (11, prefix)]

    with beam.Pipeline() as p:
        side = (p | "events" >> beam.Create(events)
                | "stamp events" >> beam.Map(lambda e: window.TimestampedValue(ModelMetadata(e[1], e[1]), e[0]))
                | "event windows" >> beam.WindowInto(window.FixedWindows(10)))
        answers = (p | "elements" >> beam.Create([(2, b"2"), (12, b"12")])
                   | "stamp" >> beam.Map(lambda e: window.TimestampedValue(e[1], e[0]))
                   | "windows" >> beam.WindowInto(window.FixedWindows(10))
                   | RunInference(BundleModelHandler(str(bundles["a"]), content_type="text/csv"),
                                  model_metadata_pcoll=side)
                   | beam.Map(lambda r: (r.example.decode(), r.inference.decode(), r.model_id)))
        assert_that(answers, equal_to([("2", "B 20", f"{archive}:model/1"), ("12", "C 36", f"{prefix}:model/1")]))
