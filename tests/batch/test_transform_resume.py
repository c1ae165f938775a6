"""Resuming safely: OUTPUT/_tfservo_job.json records the settings the outputs were made with,
so a rerun with other settings stops (both runners) instead of keeping outputs they would not
give; and a run aborts the unfinished S3 multipart uploads a killed run left for its outputs."""

from __future__ import annotations

import logging
import shutil

import orjson
import pytest
from click.testing import CliRunner
from s3_server import s3_client, upload_dir
from transform_jobs import HALF_PLUS_THREE, INSURANCE, hp3, lines, state, write  # noqa: F401

from tfservo.batch.engines.beam import run_beam_transform
from tfservo.batch.engines.run import run_transform
from tfservo.batch.job import JobError, TransformJob
from tfservo.batch.state import JOB_NAME, REPORT_NAME
from tfservo.cli.transform import transform as transform_command


def job(source, out, model=HALF_PLUS_THREE, **flags) -> TransformJob:
    return TransformJob(model=str(model), input=str(source), output=str(out), **flags)


def snapshot(root) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def done_job(hp3, tmp_path):
    """Insurance quotes transformed once into tmp/out by the local engine."""
    write(tmp_path / "in" / "a.csv", "a,1\n")
    write(tmp_path / "in" / "deep" / "b.csv", "b,2\nb2,2.5\n")
    assert run_transform(job(tmp_path / "in", tmp_path / "out", **INSURANCE), service=hp3, progress="none").done == 2
    return tmp_path / "in", tmp_path / "out"


def test_the_description_records_the_bundle_its_versions_and_the_flags(done_job):
    _, out = done_job
    doc = orjson.loads((state(out) / JOB_NAME).read_bytes())
    assert doc["model"] == str(HALF_PLUS_THREE.resolve()) and doc["versions"] == {"half_plus_three": [123, 124]}
    assert doc["flags"]["--content-type"] == "text/csv" and doc["flags"]["--output-filter"] == "$[0,-1]"
    assert "--max-payload" not in doc["flags"]  # one line per record: how requests are packed cannot show


def test_same_settings_resume_on_either_runner(hp3, done_job):
    source, out = done_job
    write(out / "a.csv.out", "kept\n")
    summary = run_transform(job(source, out, **INSURANCE, max_payload_mb=1, max_concurrent_transforms=1),
                            service=hp3, progress="none")
    assert (summary.skipped, summary.done) == (2, 0)
    summary = run_beam_transform(job(source, out, **INSURANCE))
    assert (summary.skipped, summary.done) == (2, 0)
    assert lines(out / "a.csv.out") == ["kept"]


@pytest.mark.parametrize("runner", ["local", "beam"])
def test_changed_flags_stop_the_run_before_it_touches_output(done_job, runner):
    source, out = done_job
    before = snapshot(out)
    changed = job(source, out, **{**INSURANCE, "output_filter": "$[-1]"}, accept="text/csv")
    with pytest.raises(JobError) as caught:
        run_transform(changed) if runner == "local" else run_beam_transform(changed)  # no model loaded first
    message = caught.value.message
    assert f"OUTPUT {out} holds outputs made with other settings ({state(out) / JOB_NAME})" in message
    assert '--accept was unset, now "text/csv"; --output-filter was "$[0,-1]", now "$[-1]"' in message
    assert "add --overwrite to redo every object with these settings, or write to another OUTPUT" in message
    assert "--content-type" not in message
    assert snapshot(out) == before


def test_the_cli_says_which_flags_changed(done_job):
    source, out = done_job
    result = CliRunner().invoke(transform_command, [
        str(HALF_PLUS_THREE), str(source), str(out), "--content-type", "application/jsonlines",
        "--split-type", "Line", "--assemble-with", "Line",
    ])
    assert result.exit_code == 2, result.output
    assert '--content-type was "text/csv", now "application/jsonlines"' in result.output
    assert '--input-filter was "$[1:]", now unset' in result.output


def test_a_changed_bundle_is_a_changed_setting(hp3, done_job, tmp_path):
    source, out = done_job
    other = tmp_path / "model" / "half_plus_three"
    shutil.copytree(HALF_PLUS_THREE / "00000123", other / "00000123")
    with pytest.raises(JobError, match=f"MODEL was {HALF_PLUS_THREE.resolve()}, now {other.resolve()}"):
        run_transform(job(source, out, model=other, **INSURANCE))
    # the same path with a new version: found once the bundle is opened, still before any output is written
    first = tmp_path / "first"
    shutil.copytree(source, first / "in")
    run_transform(job(first / "in", first / "out", model=other, **INSURANCE), progress="none")
    shutil.copytree(HALF_PLUS_THREE / "00000123", other / "00000124")
    before = snapshot(first / "out")
    with pytest.raises(JobError, match="the bundle's versions were half_plus_three 123, now half_plus_three 123, 124"):
        run_beam_transform(job(first / "in", first / "out", model=other, **INSURANCE))
    assert snapshot(first / "out") == before


def test_skip_mode_may_resume_a_fail_mode_run_but_not_the_reverse(hp3, tmp_path):
    write(tmp_path / "in" / "good.csv", "g,1\n")
    write(tmp_path / "in" / "bad.csv", "b,1\nb,oops\n")
    out = tmp_path / "out"
    assert run_transform(job(tmp_path / "in", out, **INSURANCE), service=hp3, progress="none").done == 1
    summary = run_transform(job(tmp_path / "in", out, **INSURANCE, on_record_error="skip", placeholder="-"),
                            service=hp3, progress="none")
    assert (summary.skipped, summary.done) == (1, 1) and lines(out / "bad.csv.out") == ["b,3.5", "-"]
    with pytest.raises(JobError, match='--placeholder was "-", now "X"'):
        run_transform(job(tmp_path / "in", out, **INSURANCE, on_record_error="skip", placeholder="X"), service=hp3)
    with pytest.raises(JobError, match='--on-record-error was "skip", now "fail"'):
        run_transform(job(tmp_path / "in", out, **INSURANCE), service=hp3)


def test_overwrite_with_changed_flags_leaves_no_output_of_the_old_ones(hp3, done_job):
    source, out = done_job
    write(source / "deep" / "b.csv", "b,two\n")  # fails under the new run: its old .out must not stay
    summary = run_transform(job(source, out, **{**INSURANCE, "output_filter": "$[-1]"}, overwrite=True),
                            service=hp3, progress="none")
    assert summary.done == 1 and [o.obj.rel for o in summary.failed] == ["deep/b.csv"]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == ["a.csv.out"]
    assert sorted(p.name for p in state(out).iterdir()) == [REPORT_NAME, JOB_NAME]
    assert lines(out / "a.csv.out") == ["3.5"]
    assert orjson.loads((state(out) / JOB_NAME).read_bytes())["flags"]["--output-filter"] == "$[-1]"
    # now the new settings resume
    summary = run_transform(job(source, out, **{**INSURANCE, "output_filter": "$[-1]"}), service=hp3, progress="none")
    assert (summary.skipped, len(summary.failed)) == (1, 1)


def test_unreadable_description_is_a_clear_error(hp3, done_job):
    source, out = done_job
    write(state(out) / JOB_NAME, "{not json")
    with pytest.raises(JobError, match=f"{state(out) / JOB_NAME} is not valid JSON .* Use --overwrite"):
        run_transform(job(source, out, **INSURANCE), service=hp3)
    assert run_transform(job(source, out, **INSURANCE, overwrite=True), service=hp3, progress="none").done == 2


# -- S3: unfinished multipart uploads of killed runs ---------------------------------------------


def test_unfinished_uploads_of_the_jobs_outputs_are_aborted_and_no_others(hp3, tmp_path, s3_endpoint, s3_bucket,
                                                                          caplog):
    write(tmp_path / "in" / "q1.csv", "a,1\nb,2\n")
    write(tmp_path / "in" / "deep" / "q2.csv", "c,3\n")
    upload_dir(s3_endpoint, s3_bucket, "jobs/in", tmp_path / "in")
    client = s3_client(s3_endpoint)
    left = {}
    for key in ("jobs/out/q1.csv.out", "jobs/out/deep/q2.csv.out", "jobs/out/q1.csv.out",  # two for one key
                "jobs/out/someone-else.bin", "jobs/out-other/q1.csv.out", "jobs/out/zzz/q1.csv.out"):
        upload_id = client.create_multipart_upload(Bucket=s3_bucket, Key=key)["UploadId"]
        client.upload_part(Bucket=s3_bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"half an output")
        left[upload_id] = key
    source, dest = f"s3://{s3_bucket}/jobs/in/", f"s3://{s3_bucket}/jobs/out/"
    caplog.set_level(logging.INFO, logger="tfservo.batch")
    summary = run_transform(job(source, dest, **INSURANCE), service=hp3, progress="none")
    assert summary.ok and summary.done == 2

    remaining = {u["UploadId"]: u["Key"] for u in client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])}
    assert sorted(remaining.values()) == ["jobs/out-other/q1.csv.out", "jobs/out/someone-else.bin",
                                          "jobs/out/zzz/q1.csv.out"]
    aborted = [r.getMessage() for r in caplog.records if r.getMessage().startswith("aborted an unfinished upload")]
    assert len(aborted) == 3
    assert any(f"upload to s3://{s3_bucket}/jobs/out/deep/q2.csv.out (started " in line for line in aborted)

    def get(key: str) -> bytes:
        return client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()

    assert get("jobs/out/q1.csv.out") == b"a,3.5\nb,4.0\n" and get("jobs/out/deep/q2.csv.out") == b"c,4.5\n"

    # --overwrite with other flags on S3: the earlier outputs go first (a failing object keeps none)
    client.put_object(Bucket=s3_bucket, Key="jobs/in/deep/q2.csv", Body=b"c,oops\n")
    summary = run_transform(job(source, dest, **{**INSURANCE, "output_filter": "$[-1]"}, overwrite=True),
                            service=hp3, progress="none")
    assert [o.obj.rel for o in summary.failed] == ["deep/q2.csv"]
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket, Prefix="jobs/out/")["Contents"])
    assert keys == ["jobs/out/q1.csv.out"]
    assert get("jobs/out/q1.csv.out") == b"3.5\n4.0\n"
