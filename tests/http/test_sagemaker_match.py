"""Where the source workflows depend on SageMaker's behaviour, the transform behaves as SageMaker:
MultiRecord framing, output filters on any input, an output prefix of .out files only, and the
content type a job without one sends."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from conftest import SMC, write_code
from s3_server import s3_client, upload_dir
from transform_jobs import HALF_PLUS_THREE, lines, state, write

from tfservo.batch.engines.run import run_transform
from tfservo.batch.job import JobError, TransformJob
from tfservo.batch.state import JOB_NAME, REPORT_NAME

# The insurance blog's handler, in its own style: the MultiRecord body is split on "\n" and
# the last (empty) piece deleted, which is right only when every record ends with its newline.
INSURANCE_HANDLER = """
    import json
    import requests


    def handler(data, context):
        if context.request_content_type == 'text/csv':
            payload = data.read().decode('latin-1')
            list_of_instances = payload.split('\\n')
            del(list_of_instances[-1])
            quotation_ids = []
            instances = []
            for instance in list_of_instances:
                values = instance.split(';')
                quotation_ids.append(values[0])
                instances.append(float(values[1]))
            response = requests.post(context.rest_uri, data=json.dumps({'instances': instances}))
            predictions = response.json()['predictions']
            lines = [f'{quotation_id},{prediction}' for quotation_id, prediction in zip(quotation_ids, predictions)]
            return '\\n'.join(lines), 'text/csv'
        raise ValueError(f'{context.request_content_type} is not supported, send text/csv')
"""

IMAGE_HANDLER = """
    import json


    def input_handler(data, context):
        if context.request_content_type != 'application/x-image':
            raise ValueError(f'unsupported content type {context.request_content_type}')
        return json.dumps({'instances': [float(len(data.read()))]})


    def output_handler(response, context):
        return response.content, 'application/json'
"""


@pytest.fixture(scope="module")
def insurance_bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("insurance") / "model"
    shutil.copytree(HALF_PLUS_THREE / "00000124", root / "00000124")
    write_code(root / "code", INSURANCE_HANDLER)
    return root


@pytest.fixture(scope="module")
def image_bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("images") / "model"
    shutil.copytree(HALF_PLUS_THREE / "00000124", root / "00000124")
    write_code(root / "code", IMAGE_HANDLER)
    return root


def test_the_insurance_handler_gets_every_record_of_a_multirecord_request(insurance_bundle, tmp_path):
    quotes = [(f"Qé{i:03d}", i * 0.5) for i in range(1, 301)]
    write(tmp_path / "in" / "quotes.csv", "".join(f"{q};{v}\n" for q, v in quotes).encode("latin-1"))
    for name, payload in (("one-request", 6.0), ("many-requests", 0.001)):
        job = TransformJob(
            str(insurance_bundle), str(tmp_path / "in"), str(tmp_path / name), content_type="text/csv",
            split_type="Line", batch_strategy="MultiRecord", assemble_with="Line", max_payload_mb=payload,
        )
        summary = run_transform(job, progress="none")
        assert summary.ok, [o.failure for o in summary.failed]
        got = lines(tmp_path / name / "quotes.csv.out")
        assert got == [f"{q},{0.5 * v + 3}" for q, v in quotes]  # one line per record, none lost


def test_crlf_records_keep_their_own_line_ending(insurance_bundle, tmp_path):
    write(tmp_path / "in" / "q.csv", b"A;1\r\nB;2\r\nC;3\r\n")
    job = TransformJob(str(insurance_bundle), str(tmp_path / "in"), str(tmp_path / "out"), content_type="text/csv",
                       split_type="Line", assemble_with="Line")
    summary = run_transform(job, progress="none")
    assert summary.ok and lines(tmp_path / "out" / "q.csv.out") == ["A,3.5", "B,4.0", "C,4.5"]


def test_an_output_filter_works_on_image_answers(image_bundle, tmp_path):
    write(tmp_path / "in" / "a.jpg", b"\xff\xd8" + b"x" * 98)
    job = TransformJob(str(image_bundle), str(tmp_path / "in"), str(tmp_path / "out"),
                       content_type="application/x-image", output_filter="$.predictions[0]").validated()
    summary = run_transform(job, progress="none")
    assert summary.ok, [o.failure for o in summary.failed]
    assert (tmp_path / "out" / "a.jpg.out").read_bytes() == b"53.0"  # 0.5 · 100 bytes + 3, the filtered answer
    with pytest.raises(JobError, match="--input-filter and --join-source need CSV or JSON records"):
        TransformJob("m", "in", "out", content_type="application/x-image", input_filter="$[0]").validated()


def test_without_content_type_objects_go_as_json_and_images_get_a_hint(image_bundle, tmp_path, caplog):
    write(tmp_path / "in" / "a.jpg", b"\xff\xd8 picture")
    job = TransformJob(str(image_bundle), str(tmp_path / "in"), str(tmp_path / "out"))
    with caplog.at_level(logging.WARNING, logger="tfservo.batch"):
        summary = run_transform(job, progress="none")
    (failed,) = summary.failed  # the handler saw application/json, as it would on SageMaker
    assert "500" in failed.failure.error and "unsupported content type application/json" in failed.failure.error
    hints = [r.getMessage() for r in caplog.records if "--content-type application/x-image" in r.getMessage()]
    assert len(hints) == 1 and "1 of 1 input objects are images (e.g. a.jpg)" in hints[0]


def test_the_output_prefix_holds_only_out_files_and_state_is_found_again(tmp_path):
    write(tmp_path / "in" / "good.csv", "g,1\n")
    write(tmp_path / "in" / "bad.csv", "b,1\nb,oops\n")
    flags = dict(content_type="text/csv", split_type="Line", assemble_with="Line", input_filter="$[1:]",
                 join_source="Input", output_filter="$[0,-1]", on_record_error="skip",
                 state_dir=str(tmp_path / "elsewhere"))
    job = TransformJob(str(HALF_PLUS_THREE), str(tmp_path / "in"), str(tmp_path / "out"), **flags)
    assert run_transform(job, progress="none").ok
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["bad.csv.out", "good.csv.out"]
    assert sorted(str(p.relative_to(tmp_path / "elsewhere")) for p in (tmp_path / "elsewhere").rglob("*") if p.is_file()) == [
        "deadletters/bad.csv.deadletter.jsonl", REPORT_NAME, JOB_NAME,
    ]
    changed = TransformJob(str(HALF_PLUS_THREE), str(tmp_path / "in"), str(tmp_path / "out"),
                           **{**flags, "output_filter": "$[-1]"})
    with pytest.raises(JobError, match="holds outputs made with other settings"):  # the rerun found its state
        run_transform(changed, progress="none")


def test_state_an_earlier_tfservo_left_in_output_is_moved_out(tmp_path):
    write(tmp_path / "in" / "a.csv", "1\n")
    out = tmp_path / "out"
    flags = dict(content_type="text/csv", split_type="Line", assemble_with="Line")
    job = TransformJob(str(HALF_PLUS_THREE), str(tmp_path / "in"), str(out), **flags)
    assert run_transform(job, progress="none").ok
    # what tfservo kept inside OUTPUT before: the description, a report, a dead-letter file
    (state(out) / JOB_NAME).rename(out / "_tfservo_job.json")
    write(out / "_tfservo_failures.json", "{}")
    write(out / "a.csv.deadletter.jsonl", '{"record": 1}\n')
    summary = run_transform(job, progress="none")
    assert summary.skipped == 1  # resumed with the description it found in OUTPUT
    assert sorted(p.name for p in out.iterdir()) == ["a.csv.out"]
    assert (state(out) / "deadletters" / "a.csv.deadletter.jsonl").read_text() == '{"record": 1}\n'
    assert (state(out) / JOB_NAME).is_file()


def test_s3_output_prefix_holds_only_out_files(tmp_path, s3_endpoint, s3_bucket):
    write(tmp_path / "in" / "q.csv", "a,1\nb,oops\n")
    upload_dir(s3_endpoint, s3_bucket, "m/in", tmp_path / "in")
    job = TransformJob(str(HALF_PLUS_THREE), f"s3://{s3_bucket}/m/in/", f"s3://{s3_bucket}/m/out/",
                       content_type="text/csv", split_type="Line", assemble_with="Line", input_filter="$[1:]",
                       on_record_error="skip")
    assert run_transform(job, progress="none").ok
    client = s3_client(s3_endpoint)
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket, Prefix="m/")["Contents"])
    assert [k for k in keys if k.startswith("m/out/")] == ["m/out/q.csv.out"]
    assert "m/out.tfservo-state/deadletters/q.csv.deadletter.jsonl" in keys
    with pytest.raises(JobError, match="bucket's root"):
        TransformJob("m", "in", f"s3://{s3_bucket}/").validated()


def test_container_csv_batch_file_as_sagemaker_frames_it(tmp_path):
    shutil.copy(SMC / "data" / "batch.csv", tmp_path / "batch.csv")
    job = TransformJob(str(HALF_PLUS_THREE), str(tmp_path / "batch.csv"), str(tmp_path / "out"),
                       content_type="text/csv", split_type="Line", assemble_with="Line", accept="text/csv")
    assert run_transform(job, progress="none").ok
    assert lines(tmp_path / "out" / "batch.csv.out") == ["3.5,4.0,5.5"] * 10
    assert json.loads((state(tmp_path / "out") / JOB_NAME).read_bytes())["flags"]["--split-type"] == "Line"


def test_each_bundles_code_applies_to_its_own_models(image_bundle, tmp_path):
    """`serve A B` where only B has code/inference.py: A's models answer by content conversion."""
    from tfservo.core.settings import resolve_settings
    from tfservo.service.factory import build_service

    plain = tmp_path / "plain" / "half_plus_two"
    shutil.copytree(SMC / "resources" / "mme" / "half_plus_two", plain)
    service = build_service(resolve_settings(paths=[str(plain), str(image_bundle)], multi_model=False))
    try:
        names = service.manager.model_names()
        assert names == ["half_plus_two", "model"]
        a = service.invoker.invoke(b"1.0\n2.0\n", "text/csv", custom_attributes="tfs-model-name=half_plus_two")
        assert a.status == 200 and json.loads(a.body) == {"predictions": [2.5, 3.0]}
        b = service.invoker.invoke(b"\xff" * 10, "application/x-image", custom_attributes="tfs-model-name=model")
        assert b.status == 200 and json.loads(b.body) == {"predictions": [8.0]}  # through B's handler
    finally:
        service.close()
