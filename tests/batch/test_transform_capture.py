"""`tfservo transform --data-capture` (SageMaker's BatchDataCaptureConfig): every request the
job sends and the answer it got, as Model Monitor's lines, one file per object published with
its .out — to a local folder and to moto's S3 — and none for an object that failed."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from conftest import handler_bundle
from s3_server import s3_bucket, s3_client, s3_endpoint  # noqa: F401
from transform_jobs import HALF_PLUS_THREE, hp3, write  # noqa: F401

from tfservo.batch.engines.run import run_transform
from tfservo.batch.job import JobError, TransformJob

CSV_FLAGS = {"content_type": "text/csv", "split_type": "Line", "assemble_with": "Line"}


def capture_files(root: Path) -> dict[str, list[dict]]:
    """Each capture file under root by its object's name → its parsed lines (a half line fails)."""
    found = {}
    for path in sorted(root.rglob("*.jsonl")):
        text = path.read_text()
        assert text.endswith("\n")
        hour = path.relative_to(root).parts[:4]
        assert len(hour) == 4 and all(part.isdigit() for part in hour), path  # yyyy/mm/dd/hh
        found[str(Path(*path.relative_to(root).parts[4:]))] = [json.loads(line) for line in text.splitlines()]
    return found


def test_each_request_and_answer_is_captured_per_object_with_inference_ids(hp3, tmp_path):
    write(tmp_path / "in" / "a.csv", "".join(f"{i}.0\n" for i in range(10)))
    write(tmp_path / "in" / "sub" / "b.csv", "1.0\n2.0\n")
    job = TransformJob(str(HALF_PLUS_THREE), str(tmp_path / "in"), str(tmp_path / "out"), **CSV_FLAGS,
                       max_payload_mb=0.00002, data_capture=str(tmp_path / "capture"), generate_inference_id=True)
    summary = run_transform(job, service=hp3, progress="none")
    assert summary.ok and summary.records == 12
    captured = capture_files(tmp_path / "capture")
    assert sorted(captured) == ["a.csv.jsonl", "sub/b.csv.jsonl"]
    a = captured["a.csv.jsonl"]
    assert len(a) == 2  # 10 lines at 5 per request (--max-payload 20 bytes)
    sent = "".join(line["captureData"]["endpointInput"]["data"] for line in a)
    assert sent == "".join(f"{i}.0\n" for i in range(10))
    answered = [p for line in a for p in json.loads(line["captureData"]["endpointOutput"]["data"])["predictions"]]
    assert answered == [i / 2 + 3 for i in range(10)]
    assert [line["eventMetadata"]["inferenceId"] for line in a] == ["a.csv:1", "a.csv:6"]
    first = a[0]
    assert first["captureData"]["endpointInput"] == {"observedContentType": "text/csv", "mode": "INPUT",
                                                     "data": "0.0\n1.0\n2.0\n3.0\n4.0\n", "encoding": "CSV"}
    assert first["captureData"]["endpointOutput"]["encoding"] == "JSON"
    assert first["eventVersion"] == "0" and first["eventMetadata"]["inferenceTime"].endswith("Z")
    assert len({line["eventMetadata"]["eventId"] for line in a}) == 2
    assert [line["eventMetadata"]["inferenceId"] for line in captured["sub/b.csv.jsonl"]] == ["sub/b.csv:1"]


def test_a_failed_object_publishes_no_capture_and_a_resumed_run_captures_only_new_work(hp3, tmp_path):
    write(tmp_path / "in" / "good.csv", "1.0\n2.0\n")
    write(tmp_path / "in" / "bad.csv", "1.0\nnot a number\n")
    flags = dict(**CSV_FLAGS, data_capture=str(tmp_path / "capture"))
    job = TransformJob(str(HALF_PLUS_THREE), str(tmp_path / "in"), str(tmp_path / "out"), **flags)
    summary = run_transform(job, service=hp3, progress="none")
    assert [o.obj.rel for o in summary.failed] == ["bad.csv"]
    assert sorted(capture_files(tmp_path / "capture")) == ["good.csv.jsonl"]
    assert not [p for p in (tmp_path / "capture").rglob("*") if p.is_file() and "partial" in p.name]
    write(tmp_path / "in" / "bad.csv", "1.0\n3.0\n")  # fixed: the rerun does only it
    again = run_transform(job, service=hp3, progress="none")
    assert again.ok and again.skipped == 1
    captured = capture_files(tmp_path / "capture")
    assert sorted(captured) == ["bad.csv.jsonl", "good.csv.jsonl"]
    assert "inferenceId" not in captured["bad.csv.jsonl"][0]["eventMetadata"]  # no --generate-inference-id


IMAGE_HANDLER = """
    import json

    def handler(data, context):
        return json.dumps({"predictions": [len(data.read())]}), "application/json"
"""


def test_capture_to_s3_and_opaque_bodies_as_base64(tmp_path, s3_endpoint, s3_bucket):
    image = bytes(range(256))
    write(tmp_path / "in" / "doc.bin", image)
    bundle = handler_bundle(tmp_path / "bundle", IMAGE_HANDLER)
    job = TransformJob(str(bundle), str(tmp_path / "in"), str(tmp_path / "out"), content_type="application/x-image",
                       data_capture=f"s3://{s3_bucket}/capture")
    assert run_transform(job, progress="none").ok
    s3 = s3_client(s3_endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert len(keys) == 1 and keys[0].startswith("capture/") and keys[0].endswith("/doc.bin.jsonl")
    (line,) = s3.get_object(Bucket=s3_bucket, Key=keys[0])["Body"].read().splitlines()
    sent = json.loads(line)["captureData"]["endpointInput"]
    assert sent["encoding"] == "BASE64" and base64.b64decode(sent["data"]) == image
    assert json.loads(line)["captureData"]["endpointOutput"]["data"] == '{"predictions": [256]}'


def test_generate_inference_id_needs_a_destination():
    try:
        TransformJob("m", "in", "out", generate_inference_id=True).validated()
    except JobError as exc:
        assert "--data-capture" in exc.message
    else:
        raise AssertionError("accepted")
