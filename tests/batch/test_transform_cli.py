"""`tfservo transform` as a user runs it (a real subprocess), and the server side of SageMaker's
batch contract (`GET /execution-parameters` and the SAGEMAKER_* batch variables)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import NEGATIVE_QUOTES_HANDLER, REPO, SMC, write_code
from server_process import TFSERVO, ServerProcess, run_cli

from tfservo.batch.engines.run import run_transform
from tfservo.batch.job import TransformJob
from tfservo.batch.loading import load_service
from tfservo.batch.state import JOB_NAME, REPORT_NAME
from tfservo.core.settings import ConfigError, execution_parameters_from_env, resolve_settings

MME = SMC / "resources" / "mme"  # half_plus_three and half_plus_two side by side
INSURANCE = [
    "--content-type", "text/csv", "--split-type", "Line", "--assemble-with", "Line",
    "--input-filter", "$[1:]", "--join-source", "Input", "--output-filter", "$[0,-1]",
]
OPTIONS = [
    "--content-type", "--accept", "--split-type", "--batch-strategy", "--max-payload",
    "--max-concurrent-transforms", "--assemble-with", "--input-filter", "--output-filter",
    "--join-source", "--compression-type", "--data-type", "--custom-attributes", "--env",
    "--on-record-error", "--placeholder", "--overwrite", "--progress", "--log-level",
]


def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1]


def test_help_describes_every_option():
    done = run_cli(["transform", "--help"])
    assert done.returncode == 0
    text = done.stdout.decode()
    assert "Usage: tfservo transform [OPTIONS] MODEL INPUT OUTPUT" in text
    for option in OPTIONS:
        assert option in text, option
    assert "--split-type [None|Line|RecordIO|TFRecord]" in text


def test_bad_flags_are_usage_errors():
    done = run_cli(["transform", "m", "in", "out", "--split-type", "Line", "--join-source", "Input"])
    assert done.returncode == 2
    assert b"add --assemble-with Line" in done.stderr


def test_insurance_quotes_with_env_picking_the_default_model(tmp_path):
    (tmp_path / "in" / "2024").mkdir(parents=True)
    (tmp_path / "in" / "2024" / "quotes.csv").write_text("".join(f"Q{i},{i}.0\n" for i in range(1, 101)))
    (tmp_path / "in" / "bad.csv").write_text("B1,1.0\nB2,two\nB3,3.0\n")
    done = run_cli([
        "transform", str(MME), str(tmp_path / "in"), str(tmp_path / "out"), *INSURANCE,
        "--env", "SAGEMAKER_TFS_DEFAULT_MODEL_NAME=half_plus_two",
    ])
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    # half_plus_two (y = x/2 + 2), not the first model by name (half_plus_three)
    assert lines(tmp_path / "out" / "2024" / "quotes.csv.out") == [f"Q{i},{i / 2 + 2}" for i in range(1, 101)]
    assert f"FAILED {tmp_path / 'in' / 'bad.csv'}: line 2: the model answered 400:" in stderr
    assert "    record: B2,two" in stderr
    assert "1 of 2 objects transformed; 1 failed; 100 records" in stderr
    assert f"failure report: {tmp_path / 'out.tfservo-state' / REPORT_NAME}" in stderr
    assert not (tmp_path / "out" / "bad.csv.out").exists()


def test_a_record_its_handler_refuses_is_one_failed_line_without_tracebacks(tmp_path):
    """The mini-batch, its halves and the record alone each raise in the handler: the operator
    reads one FAILED line for the record (tracebacks at --log-level debug)."""
    bundle = tmp_path / "bundle"
    shutil.copytree(MME / "half_plus_two", bundle / "half_plus_two")
    write_code(bundle / "code", NEGATIVE_QUOTES_HANDLER)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text("1.0\n-2.0\n3.0\n4.0\n")
    args = ["transform", str(bundle), str(tmp_path / "in"), str(tmp_path / "out"), "--content-type", "text/csv",
            "--split-type", "Line", "--batch-strategy", "MultiRecord"]
    stderr = run_cli(args).stderr.decode()
    assert "FAILED" in stderr and "line 2:" in stderr and "negative values are not quotes: -2.0" in stderr, stderr
    assert "Traceback" not in stderr and "ERROR" not in stderr, stderr
    debug = run_cli([*args, "--log-level", "debug", "--overwrite"]).stderr.decode()
    assert "Traceback" in debug and "input_handler in" in debug, debug[-3000:]


def test_image_folder_from_one_command(tmp_path):
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import build_image_example as example
    finally:
        sys.path.remove(str(REPO / "examples"))
    example.build_model(str(tmp_path / "model"))
    example.write_images(str(tmp_path / "images"))
    done = run_cli(["transform", str(tmp_path / "model"), str(tmp_path / "images"), str(tmp_path / "out"),
                    "--max-concurrent-transforms", "2", "--progress", "log"])
    assert done.returncode == 0, done.stderr.decode()
    assert "6 of 6 objects transformed; 6 records" in done.stderr.decode()
    outs = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*.out"))
    assert outs == sorted(f"{n}.out" for n in ["cats/black.jpg", "cats/grey.png", "cats/white.jpg",
                                               "dogs/green.jpg", "dogs/nested/blue.png", "dogs/red.png"])
    (red,) = json.loads((tmp_path / "out" / "dogs" / "red.png.out").read_bytes())["predictions"]
    assert red["mean_rgb"] == [255.0, 0.0, 0.0]


# -- kill -9 and resume -----------------------------------------------------------------------

SLOW_HANDLER = '''
import json
import time


def input_handler(data, context):
    time.sleep(0.1)  # slow enough to kill the run half way
    rows = [line.split(",") for line in data.read().decode().splitlines() if line]
    return json.dumps({"instances": [float(row[-1]) for row in rows]})


def output_handler(response, context):
    return response.content, "application/json"
'''


@pytest.fixture
def slow_job(tmp_path):
    bundle = tmp_path / "slow"
    shutil.copytree(SMC / "resources" / "models" / "half_plus_three" / "00000123", bundle / "half_plus_three" / "00000123")
    write_code(bundle / "code", SLOW_HANDLER)
    for i in range(40):
        folder = tmp_path / "in" / f"part-{i // 10}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"q{i:02d}.csv").write_text("".join(f"id{i}-{j},{i + j / 4}\n" for j in range(3)))
    return bundle, tmp_path / "in"


def test_killed_run_resumes_to_identical_output_and_never_shows_a_partial_out(slow_job, tmp_path):
    bundle, source = slow_job
    flags = dict(content_type="text/csv", split_type="Line", assemble_with="Line", join_source="Input",
                 output_filter="$[0,-1]")
    reference = tmp_path / "reference"
    service = load_service(str(bundle))
    try:
        summary = run_transform(
            TransformJob(str(bundle), str(source), str(reference), max_concurrent_transforms=8, **flags),
            service=service, progress="none",
        )
    finally:
        service.close()
    assert summary.ok and summary.done == 40
    expected = {p.relative_to(reference): p.read_bytes() for p in reference.rglob("*.out")}
    assert len(expected) == 40

    out = tmp_path / "out"
    args = [TFSERVO, "transform", str(bundle), str(source), str(out), *INSURANCE[:6], "--join-source", "Input",
            "--output-filter", "$[0,-1]", "--max-concurrent-transforms", "1"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen: dict[Path, bytes] = {}
    deadline = time.monotonic() + 240
    try:
        while len(seen) < 8:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the transform made no progress"
            for path in out.rglob("*.out") if out.exists() else []:
                rel = path.relative_to(out)
                if rel not in seen:  # complete the moment it is visible under its final name
                    seen[rel] = path.read_bytes()
                    assert seen[rel] == expected[rel], rel
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    done_before = {p.relative_to(out) for p in out.rglob("*.out")}
    assert 8 <= len(done_before) < 40
    assert all((out / rel).read_bytes() == expected[rel] for rel in done_before)

    done = subprocess.run(args, capture_output=True, timeout=300)
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    assert f"resuming: {len(done_before)} of 40 objects already have their .out" in stderr
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*.out")} == expected
    assert [p.name for p in out.rglob("*") if p.is_file() and not p.name.endswith(".out")] == []  # no partials
    assert (Path(str(out) + ".tfservo-state") / JOB_NAME).is_file()


# -- the server side: /execution-parameters ----------------------------------------------------


def test_execution_parameters_follow_sagemakers_batch_variables(testdata):
    env = {
        "SAGEMAKER_BATCH": "true",
        "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "3",
        "SAGEMAKER_BATCH_STRATEGY": "SINGLE_RECORD",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "150",
    }
    with ServerProcess([str(SMC / "resources" / "models" / "half_plus_three")], env=env) as server:
        with server.client() as http:
            r = http.get("/execution-parameters")
            assert r.status_code == 200
            assert r.json() == {"MaxConcurrentTransforms": 3, "BatchStrategy": "SingleRecord", "MaxPayloadInMB": 150}
            r = http.post("/invocations", content=b"1.0\n2.0", headers={"Content-Type": "text/csv"})
            assert r.json() == {"predictions": [3.5, 4.0]}


def test_execution_parameter_defaults_and_payload_limit():
    assert execution_parameters_from_env({})["BatchStrategy"] == "MultiRecord"
    assert execution_parameters_from_env({"SAGEMAKER_BATCH_STRATEGY": "MULTI_RECORD"})["BatchStrategy"] == "MultiRecord"
    assert execution_parameters_from_env({})["MaxPayloadInMB"] == 6
    with pytest.raises(ConfigError, match="SAGEMAKER_BATCH_STRATEGY='BATCHED' must be MultiRecord"):
        execution_parameters_from_env({"SAGEMAKER_BATCH_STRATEGY": "BATCHED"})

    def limit(env: dict[str, str]) -> float:
        return resolve_settings(
            paths=["m"], host=None, port=None, grpc_port=None, max_request_mb=None, version_labels=(),
            intra_op_threads=None, inter_op_threads=None, log_level=None, env=env,
        ).max_request_mb

    # a batch job's container must take the payloads SageMaker was told it may send
    assert limit({"SAGEMAKER_BATCH": "true", "SAGEMAKER_MAX_PAYLOAD_IN_MB": "150"}) == 150
    assert limit({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "150"}) == 100
