"""The local transform engine in-process, on real models, real files and a real S3 API.

One loaded ModelService per bundle is shared by the module's tests, as one `tfservo
transform` process shares it across objects.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import textwrap
import threading

import orjson
import pytest
from conftest import REPO, SMC, TFS
from s3_server import s3_client, upload_dir
from transform_jobs import HALF_PLUS_THREE, INSURANCE, hp3, lines, state, write  # noqa: F401

from tfservo.batch import sources
from tfservo.batch.engines.local import TransformEngine
from tfservo.batch.engines.run import run_transform
from tfservo.batch.job import JobError, TransformJob
from tfservo.batch.loading import load_service
from tfservo.batch.state import JOB_NAME, REPORT_NAME


def transform(service, source, out, **flags):
    job = TransformJob(model=str(HALF_PLUS_THREE), input=str(source), output=str(out), **flags)
    return run_transform(job, service=service, progress="none")


class Spy:
    """The real invoker, with a note of each call's record count and thread."""

    def __init__(self, invoker):
        self.invoker = invoker
        self.calls: list[tuple[int, str]] = []
        self._lock = threading.Lock()

    def _note(self, body):
        with self._lock:  # each Line record goes with its own line ending, as SageMaker sends it
            self.calls.append((body.count(b"\n"), threading.current_thread().name))

    def invoke(self, body, content_type, accept=None, custom_attributes=None, model_name=None):
        self._note(body)
        return self.invoker.invoke(body, content_type, accept, custom_attributes, model_name)

    def call(self, body, content_type, accept=None, custom_attributes=None, model_name=None):
        self._note(body)
        return self.invoker.call(body, content_type, accept, custom_attributes, model_name)


# -- CSV and JSON lines -------------------------------------------------------------------------


def test_insurance_pattern_gives_id_prediction_lines(hp3, tmp_path):
    quotes = [(f"Q{i:05d}", round(i * 0.25, 2)) for i in range(1, 301)]
    write(tmp_path / "in" / "quotes.csv", "".join(f"{q},{v}\n" for q, v in quotes))
    shutil.copy(SMC / "data" / "batch.csv", tmp_path / "in" / "batch.csv")
    summary = transform(hp3, tmp_path / "in", tmp_path / "out", **INSURANCE)
    assert summary.ok and summary.done == 2 and summary.records == 310
    assert lines(tmp_path / "out" / "quotes.csv.out") == [f"{q},{v / 2 + 3}" for q, v in quotes]
    # the container's batch.csv: "1.0, 2.0, 5.0" → id 1.0, prediction for the last column 5.0
    assert lines(tmp_path / "out" / "batch.csv.out") == ["1.0,5.5"] * 10
    assert not (state(tmp_path / "out") / REPORT_NAME).exists()


def test_container_batch_csv_one_prediction_row_per_line(hp3, tmp_path):
    shutil.copy(SMC / "data" / "batch.csv", tmp_path / "batch.csv")
    flags = dict(split_type="Line", assemble_with="Line", content_type="text/csv")
    transform(hp3, tmp_path / "batch.csv", tmp_path / "csv", accept="text/csv", **flags)
    assert lines(tmp_path / "csv" / "batch.csv.out") == ["3.5,4.0,5.5"] * 10
    transform(hp3, tmp_path / "batch.csv", tmp_path / "json", **flags)
    assert lines(tmp_path / "json" / "batch.csv.out") == ["[3.5,4.0,5.5]"] * 10
    # without splitting the object is one request and the .out is the answer as it came
    transform(hp3, tmp_path / "batch.csv", tmp_path / "whole", content_type="text/csv")
    assert json.loads((tmp_path / "whole" / "batch.csv.out").read_bytes()) == {"predictions": [[3.5, 4.0, 5.5]] * 10}


def test_multirecord_requests_keep_one_output_line_per_input_line(hp3, tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "SMALL_OBJECT_BYTES", 1024)  # stream this object instead of one read
    rows = []
    for i in range(1, 3001):
        rows.append("" if i % 500 == 0 else f"{i},{i % 7}.5")
    big = write(tmp_path / "in" / "big.csv", "\n".join(rows) + "\n")
    outputs = {}
    for name, flags in {
        "one-request": dict(batch_strategy="MultiRecord"),
        "chunks": dict(batch_strategy="MultiRecord", max_payload_mb=0.0005, max_concurrent_transforms=4),
        "single": dict(batch_strategy="SingleRecord", max_concurrent_transforms=4),
    }.items():
        spy = Spy(hp3.invoker)
        job = TransformJob(str(HALF_PLUS_THREE), str(big), str(tmp_path / name), **INSURANCE, **flags)
        summary = TransformEngine(job, spy, progress="none").run()
        assert summary.ok and summary.records == 3000
        outputs[name] = (tmp_path / name / "big.csv.out").read_bytes()
        if name == "one-request":
            assert [n for n, _ in spy.calls] == [2994]  # every non-blank line in one request
        elif name == "chunks":  # a large object split into requests served by several workers
            assert len(spy.calls) > 20 and max(n for n, _ in spy.calls) <= 131  # 4-byte records in 524 bytes
            assert len({thread for _, thread in spy.calls}) > 1
        else:
            assert len(spy.calls) == 2994
    assert outputs["one-request"] == outputs["chunks"] == outputs["single"]
    out = outputs["single"].decode().split("\n")[:-1]
    assert len(out) == 3000
    assert out[0] == "1,3.75" and out[499] == "" and out[2999] == ""  # blank lines stay in place
    assert out[2998] == f"2999,{(2999 % 7 + 0.5) / 2 + 3}"


def test_json_lines_get_sagemaker_output(hp3, tmp_path):
    records = [{"id": f"r{i}", "features": float(i), "note": "x" * i} for i in range(5)]
    write(tmp_path / "in" / "data.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    flags = dict(split_type="Line", assemble_with="Line", input_filter="$.features", join_source="Input")
    transform(hp3, tmp_path / "in", tmp_path / "joined", **flags)
    joined = [json.loads(line) for line in lines(tmp_path / "joined" / "data.jsonl.out")]
    assert joined == [{**r, "SageMakerOutput": r["features"] / 2 + 3} for r in records]
    transform(hp3, tmp_path / "in", tmp_path / "kept", **flags, output_filter="$['id','SageMakerOutput']")
    kept = [json.loads(line) for line in lines(tmp_path / "kept" / "data.jsonl.out")]
    assert kept == [{"id": r["id"], "SageMakerOutput": r["features"] / 2 + 3} for r in records]


def test_nested_folders_gzip_and_manifest(hp3, tmp_path):
    src = tmp_path / "in"
    write(src / "2024" / "01" / "a.csv.gz", gzip.compress(b"a,1\nb,2\n"))
    write(src / "2024" / "02" / "b.csv.gz", gzip.compress(b"c,3\n"))
    write(src / ".hidden" / "x.csv.gz", b"not gzip: hidden files are not inputs")
    summary = transform(hp3, src, tmp_path / "out", **INSURANCE, compression_type="Gzip")
    assert summary.ok and summary.done == 2
    assert lines(tmp_path / "out" / "2024" / "01" / "a.csv.gz.out") == ["a,3.5", "b,4.0"]
    assert lines(tmp_path / "out" / "2024" / "02" / "b.csv.gz.out") == ["c,4.5"]

    plain = tmp_path / "plain"
    write(plain / "one.csv", "x,1\n")
    write(plain / "deep" / "two.csv", "y,2\n")
    write(plain / "skipped.csv", "z,3\n")
    manifest = write(tmp_path / "manifest.json", json.dumps([{"prefix": "plain/"}, "one.csv", "deep/two.csv"]))
    summary = transform(hp3, manifest, tmp_path / "from-manifest", **INSURANCE, data_type="ManifestFile")
    assert summary.ok and summary.done == 2
    assert lines(tmp_path / "from-manifest" / "deep" / "two.csv.out") == ["y,4.0"]
    assert not (tmp_path / "from-manifest" / "skipped.csv.out").exists()


def test_a_gzip_flag_on_plain_files_fails_each_object_clearly(hp3, tmp_path):
    write(tmp_path / "in" / "a.csv", "a,1\n")
    summary = transform(hp3, tmp_path / "in", tmp_path / "out", **INSURANCE, compression_type="Gzip")
    (failed,) = summary.failed
    assert "is not valid gzip" in failed.failure.error and "drop --compression-type Gzip" in failed.failure.error


# -- bad records ------------------------------------------------------------------------------


def test_a_bad_record_fails_only_its_object_then_skip_mode_dead_letters_it(hp3, tmp_path):
    write(tmp_path / "in" / "good.csv", "g1,1\ng2,2\n")
    write(tmp_path / "in" / "bad.csv", "b1,1\nb2,2\nb3,oops\nb4,4\n")
    out = tmp_path / "out"
    summary = transform(hp3, tmp_path / "in", out, **INSURANCE)
    assert summary.done == 1 and len(summary.failed) == 1
    failure = summary.failed[0].failure
    assert summary.failed[0].obj.rel == "bad.csv"
    assert failure.where == "line 3" and failure.record == "b3,oops"
    assert "400" in failure.error and "oops" in failure.error
    assert sorted(p.name for p in out.iterdir()) == ["good.csv.out"]  # OUTPUT holds only .out files
    assert sorted(p.name for p in state(out).iterdir()) == [REPORT_NAME, JOB_NAME]
    report = json.loads((state(out) / REPORT_NAME).read_bytes())
    assert report["failed_objects"][0]["object"] == "bad.csv" and report["failed_objects"][0]["where"] == "line 3"

    # the same output folder: good.csv is resumed (skipped), bad.csv goes through with a placeholder
    summary = transform(hp3, tmp_path / "in", out, **INSURANCE, on_record_error="skip", placeholder="ERROR")
    assert summary.ok and summary.skipped == 1 and summary.done == 1
    assert lines(out / "bad.csv.out") == ["b1,3.5", "b2,4.0", "ERROR", "b4,5.0"]
    (dead,) = [json.loads(line) for line in lines(state(out) / "deadletters" / "bad.csv.deadletter.jsonl")]
    assert dead["where"] == "line 3" and dead["data"] == "b3,oops" and "oops" in dead["error"]
    assert sorted(p.name for p in out.iterdir()) == ["bad.csv.out", "good.csv.out"]
    report = json.loads((state(out) / REPORT_NAME).read_bytes())
    assert report["failed_objects"] == [] and report["dead_letters"][0]["records"] == 1


def test_a_filter_that_selects_nothing_is_a_record_error(hp3, tmp_path):
    write(tmp_path / "in" / "data.jsonl", '{"features": 1.0}\n{"other": 2.0}\n')
    summary = transform(
        hp3, tmp_path / "in", tmp_path / "out", split_type="Line", assemble_with="Line", input_filter="$.features"
    )
    failure = summary.failed[0].failure
    assert failure.where == "line 2" and "no key 'features'" in failure.error


def test_a_record_over_max_payload_fails_its_object_with_a_clear_error(hp3, tmp_path):
    write(tmp_path / "in" / "wide.csv", "w1,1\nw2," + ",".join(["1.0"] * 600) + "\n")
    write(tmp_path / "in" / "ok.csv", "o1,1\n")
    summary = transform(hp3, tmp_path / "in", tmp_path / "out", **INSURANCE, max_payload_mb=0.001)
    assert [o.obj.rel for o in summary.failed] == ["wide.csv"] and summary.done == 1
    failure = summary.failed[0].failure
    assert failure.where == "line 2"
    assert "wide.csv: line 2 is" in failure.error and "over --max-payload 0.001 MB (1048 bytes)" in failure.error


def test_resume_skips_objects_already_done_and_overwrite_redoes_them(hp3, tmp_path):
    write(tmp_path / "in" / "a.csv", "a,1\n")
    write(tmp_path / "in" / "b.csv", "b,2\n")
    out = tmp_path / "out"
    assert transform(hp3, tmp_path / "in", out, **INSURANCE).done == 2
    write(out / "a.csv.out", "kept as it was\n")
    summary = transform(hp3, tmp_path / "in", out, **INSURANCE)
    assert (summary.done, summary.skipped) == (0, 2)
    assert lines(out / "a.csv.out") == ["kept as it was"]
    summary = transform(hp3, tmp_path / "in", out, **INSURANCE, overwrite=True)
    assert (summary.done, summary.skipped) == (2, 0)
    assert lines(out / "a.csv.out") == ["a,3.5"]


def test_output_inside_input_is_refused(hp3, tmp_path):
    write(tmp_path / "in" / "a.csv", "a,1\n")
    with pytest.raises(JobError, match="is inside INPUT"):
        transform(hp3, tmp_path / "in", tmp_path / "in" / "out", **INSURANCE)


# -- handlers: TFRecord and images ------------------------------------------------------------

TFRECORD_HANDLER = '''
import json
import struct

from tensorflow.core.example import example_pb2


def input_handler(data, context):
    """A TFRecord request body (framed tf.Examples) → a TF Serving regress request."""
    body, pos, examples = data.read(), 0, []
    while pos < len(body):
        (length,) = struct.unpack("<Q", body[pos:pos + 8])
        example = example_pb2.Example.FromString(body[pos + 12:pos + 12 + length])
        examples.append({"x": example.features.feature["x"].float_list.value[0]})
        pos += 12 + length + 4
    return json.dumps({"signature_name": "regress_x_to_y", "examples": examples})


def output_handler(response, context):
    if response.status_code != 200:
        raise ValueError(response.text)
    return response.content, "application/json"
'''


def _example(x: float) -> bytes:
    from tensorflow.core.example import example_pb2

    example = example_pb2.Example()
    example.features.feature["x"].float_list.value.append(x)
    return example.SerializeToString()


@pytest.fixture(scope="module")
def tfrecord_service(tmp_path_factory):
    bundle = tmp_path_factory.mktemp("tfrecord-bundle")
    shutil.copytree(TFS / "saved_model_half_plus_two_cpu", bundle / "half_plus_two")
    write(bundle / "half_plus_two" / "code" / "inference.py", textwrap.dedent(TFRECORD_HANDLER))
    service = load_service(str(bundle))
    yield service
    service.close()


def test_tfrecord_examples_through_a_handler_to_a_regress_signature(tfrecord_service, tmp_path):
    import tensorflow as tf

    values = [float(i) for i in range(40)]
    (tmp_path / "in").mkdir()
    for name, part in (("part-0", values[:25]), ("part-1", values[25:])):
        with tf.io.TFRecordWriter(str(tmp_path / "in" / f"{name}.tfrecord")) as writer:
            for x in part:
                writer.write(_example(x))
    job = TransformJob(
        "unused", str(tmp_path / "in"), str(tmp_path / "out"), split_type="TFRecord", assemble_with="Line",
        custom_attributes="tfs-method=regress", max_payload_mb=0.0005, max_concurrent_transforms=3,
    )
    summary = run_transform(job, service=tfrecord_service, progress="none")
    assert summary.ok and summary.records == 40
    got = lines(tmp_path / "out" / "part-0.tfrecord.out") + lines(tmp_path / "out" / "part-1.tfrecord.out")
    assert [float(v) for v in got] == [x / 2 + 2 for x in values]


@pytest.fixture(scope="module")
def image_example(tmp_path_factory):
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import build_image_example as example
    finally:
        sys.path.remove(str(REPO / "examples"))
    root = tmp_path_factory.mktemp("image-example")
    example.build_model(str(root / "model"))
    service = load_service(str(root / "model"))
    yield example, service
    service.close()


def test_jpeg_and_png_images_through_a_b64_handler(image_example, tmp_path):
    example, service = image_example
    names = example.write_images(str(tmp_path / "images"))
    write(tmp_path / "images" / "dogs" / "broken.jpg", b"\xff\xd8 this is not a picture")
    job = TransformJob(
        "unused", str(tmp_path / "images"), str(tmp_path / "out"), max_concurrent_transforms=2,
        content_type="application/x-image",
    )
    summary = run_transform(job, service=service, progress="none")
    assert summary.done == len(names)
    (failed,) = summary.failed
    assert failed.obj.rel == "dogs/broken.jpg" and failed.failure.where == "the object"
    assert "500" in failed.failure.error and "could not read this application/x-image image" in failed.failure.error
    for name, rgb in example.IMAGES:
        (prediction,) = orjson.loads((tmp_path / "out" / f"{name}.out").read_bytes())["predictions"]
        assert prediction["mean_rgb"] == pytest.approx(list(rgb), abs=1.5), name
    # keep going past the broken one: an empty placeholder .out and a dead letter with its bytes
    job = TransformJob(job.model, job.input, job.output, on_record_error="skip", content_type="application/x-image")
    summary = run_transform(job, service=service, progress="none")
    assert summary.ok and summary.skipped == len(names) and summary.done == 1
    assert (tmp_path / "out" / "dogs" / "broken.jpg.out").read_bytes() == b""
    (dead,) = [json.loads(x) for x in lines(state(tmp_path / "out") / "deadletters" / "dogs" / "broken.jpg.deadletter.jsonl")]
    assert dead["where"] == "the object" and "data_base64" in dead


# -- S3 ---------------------------------------------------------------------------------------


def test_s3_in_and_out_through_a_real_s3_api(hp3, tmp_path, s3_endpoint, s3_bucket, monkeypatch):
    monkeypatch.setattr(sources, "SMALL_OBJECT_BYTES", 10)  # q1.csv is streamed (ranged reads), q2.csv read whole
    write(tmp_path / "in" / "q1.csv", "a,1\nb,2\n")
    write(tmp_path / "in" / "deep" / "q2.csv", "c,3\n")
    write(tmp_path / "in" / "deep" / "bad.csv", "d,oops\n")
    upload_dir(s3_endpoint, s3_bucket, "jobs/in", tmp_path / "in")
    source, dest = f"s3://{s3_bucket}/jobs/in/", f"s3://{s3_bucket}/jobs/out/"
    summary = transform(hp3, source, dest, **INSURANCE)
    assert summary.done == 2 and [o.obj.rel for o in summary.failed] == ["deep/bad.csv"]
    assert summary.failed[0].obj.url == f"s3://{s3_bucket}/jobs/in/deep/bad.csv"
    client = s3_client(s3_endpoint)

    def get(key: str) -> bytes:
        return client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()

    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket, Prefix="jobs/out/")["Contents"])
    assert keys == ["jobs/out/deep/q2.csv.out", "jobs/out/q1.csv.out"]  # only .out files under the prefix
    state_keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket, Prefix="jobs/out.tfservo-state/")["Contents"])
    assert state_keys == ["jobs/out.tfservo-state/" + REPORT_NAME, "jobs/out.tfservo-state/" + JOB_NAME]
    assert get("jobs/out/q1.csv.out") == b"a,3.5\nb,4.0\n"
    assert get("jobs/out/deep/q2.csv.out") == b"c,4.5\n"
    assert json.loads(get("jobs/out.tfservo-state/" + REPORT_NAME))["failed_objects"][0]["object"] == "deep/bad.csv"
    # rerun: the two done objects are skipped, the bad one fails again
    summary = transform(hp3, source, dest, **INSURANCE)
    assert (summary.skipped, summary.done, len(summary.failed)) == (2, 0, 1)
