"""`transform --runner beam`: the same job on Beam's DirectRunner (in-process, and two worker
processes) gives the local engine's output tree byte for byte, the same failures and exit code."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from server_process import run_cli
from transform_jobs import (  # noqa: F401
    HALF_PLUS_THREE,
    INSURANCE,
    counts,
    hp3,
    insurance_input,
    report,
    state,
    tree,
    write,
)

from tfservo.batch.engines.beam import OUTCOMES_PREFIX, BeamSettings, run_beam_transform
from tfservo.batch.engines.run import run_transform
from tfservo.batch.job import TransformJob
from tfservo.batch.state import TransformSummary
from tfservo.cli.transform import transform as transform_command


def both(hp3, source: Path, tmp_path: Path, **flags) -> tuple[TransformSummary, TransformSummary]:
    """The job run by the local engine into tmp/local and on Beam into tmp/beam; checks they agree."""
    local = run_transform(
        TransformJob(str(HALF_PLUS_THREE), str(source), str(tmp_path / "local"), **flags),
        service=hp3, progress="none",
    )
    beam = run_beam_transform(TransformJob(str(HALF_PLUS_THREE), str(source), str(tmp_path / "beam"), **flags))
    assert tree(tmp_path / "beam") == tree(tmp_path / "local")
    assert report(tmp_path / "beam") == report(tmp_path / "local")
    assert counts(beam) == counts(local)
    assert not [p for p in (tmp_path / "beam").iterdir() if p.name.startswith(OUTCOMES_PREFIX)]
    return local, beam


def test_insurance_csv_with_filters_join_a_bad_object_and_resume(hp3, tmp_path):
    source = insurance_input(tmp_path / "in")
    local, beam = both(hp3, source, tmp_path, **INSURANCE, max_payload_mb=0.0005)  # ~40 requests for quotes.csv
    assert (beam.done, len(beam.failed), beam.records) == (3, 1, 304)
    quotes = (tmp_path / "beam" / "2024" / "quotes.csv.out").read_text().split("\n")[:-1]
    assert quotes == [f"Q{i},{(i + 0.5) / 2 + 3}" for i in range(1, 301)]
    failure = beam.failed[0].failure
    assert (failure.where, failure.record) == ("line 2", "B2,two") and "400" in failure.error

    # rerun: the done objects are skipped, the bad one fails again; a removed .out is redone
    beam = run_beam_transform(TransformJob(str(HALF_PLUS_THREE), str(source), str(tmp_path / "beam"), **INSURANCE,
                                           max_payload_mb=0.0005))
    assert (beam.skipped, beam.done, len(beam.failed)) == (3, 0, 1)
    (tmp_path / "beam" / "2024" / "quotes.csv.out").unlink()
    beam = run_beam_transform(TransformJob(str(HALF_PLUS_THREE), str(source), str(tmp_path / "beam"), **INSURANCE,
                                           max_payload_mb=0.0005))
    assert (beam.skipped, beam.done, beam.records, len(beam.failed)) == (2, 1, 300, 1)
    assert tree(tmp_path / "beam") == tree(tmp_path / "local")


def test_json_lines_with_skipped_records_and_dead_letters(hp3, tmp_path):
    rows = [{"id": f"r{i}", "features": float(i)} for i in range(40)]
    rows[7]["features"] = "seven"
    rows[31] = {"id": "r31"}  # the input filter selects nothing
    write(tmp_path / "in" / "data.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    write(tmp_path / "in" / "more.jsonl", '{"id": "m", "features": 2.0}\n')
    _, beam = both(
        hp3, tmp_path / "in", tmp_path, split_type="Line", assemble_with="Line", input_filter="$.features",
        join_source="Input", on_record_error="skip", placeholder="SKIPPED", max_payload_mb=0.0002,
    )
    assert beam.ok and [(o.obj.rel, o.dead_letters) for o in beam.dead_lettered] == [("data.jsonl", 2)]
    assert (state(tmp_path / "beam") / "deadletters" / "data.jsonl.deadletter.jsonl").exists()


def test_a_large_object_in_many_requests_with_bodies_concatenated(hp3, tmp_path):
    write(tmp_path / "in" / "big.csv", "".join(f"{i}.25\n" for i in range(4000)))
    _, beam = both(hp3, tmp_path / "in", tmp_path, content_type="text/csv", split_type="Line",
                   max_payload_mb=0.001)  # ~30 requests, their answers concatenated in order
    body = (tmp_path / "beam" / "big.csv.out").read_bytes()
    assert beam.records == 4000 and body.count(b'"predictions"') > 20


def test_whole_objects_and_one_over_max_payload(hp3, tmp_path):
    for i in range(5):
        write(tmp_path / "in" / f"r{i}.json", json.dumps({"instances": [float(i), i + 0.5]}))
    write(tmp_path / "in" / "huge.json", json.dumps({"instances": [1.0] * 400}))
    _, beam = both(hp3, tmp_path / "in", tmp_path, max_payload_mb=0.001, assemble_with="Line")
    assert [o.obj.rel for o in beam.failed] == ["huge.json"]
    assert "over --max-payload" in beam.failed[0].failure.error


def test_progress_is_live_on_the_in_process_runner_and_ends_with_beams_counters(tmp_path, caplog):
    source = insurance_input(tmp_path / "in")
    job = TransformJob(
        str(HALF_PLUS_THREE), str(source), str(tmp_path / "beam"), **INSURANCE, max_payload_mb=0.0005
    )
    with caplog.at_level(logging.INFO, logger="tfservo.batch"):
        summary = run_beam_transform(job, progress="log", progress_interval=0.05)
    assert (summary.done, len(summary.failed), summary.records) == (3, 1, 304)
    lines = [r.getMessage() for r in caplog.records if r.name == "tfservo.batch"]
    progress = [line for line in lines if line.startswith("progress: ")]
    assert len(progress) > 2 and progress[0].startswith("progress: 0/4 objects, 0 records")
    # the last line: what the DoFns counted, the same as the summary
    assert progress[-1].startswith("progress: 4/4 objects (1 failed), 304 records, "), progress[-1]
    assert progress[-1].endswith(", ETA 0:00:00")  # every byte of the input counted
    counters = r"^Beam counters: 4 objects \(1 failed\), [1-9]\d* requests, 305 records answered; "
    assert re.search(counters + r"request latency mean \d+ ms, max \d+ ms$", lines[-1]), lines[-1]


def test_the_cli_on_two_worker_processes_matches_the_local_engine(hp3, tmp_path):
    source = insurance_input(tmp_path / "in")
    run_transform(TransformJob(str(HALF_PLUS_THREE), str(source), str(tmp_path / "local"), **INSURANCE,
                               max_payload_mb=0.0005), service=hp3, progress="none")
    flags = ["--content-type", "text/csv", "--split-type", "Line", "--assemble-with", "Line",
             "--input-filter", "$[1:]", "--join-source", "Input", "--output-filter", "$[0,-1]",
             "--max-payload", "0.0005", "--progress", "log"]
    done = run_cli([
        "transform", str(HALF_PLUS_THREE), str(source), str(tmp_path / "beam"), *flags, "--runner", "beam",
        "--beam-runner", "DirectRunner", "--beam-option", "direct_num_workers=2",
        "--beam-option", "direct_running_mode=multi_processing",
    ], timeout=300)
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert f"FAILED {source / 'bad.csv'}: line 2: the model answered 400:" in stderr
    assert "3 of 4 objects transformed; 1 failed; 304 records" in stderr
    # workers in other processes: no live progress (said so), Beam's counters at the end
    assert "DirectRunner runs the workers outside this process, so there is no live progress" in stderr
    assert re.search(r"Beam counters: 4 objects \(1 failed\), \d+ requests, 305 records answered", stderr)
    assert tree(tmp_path / "beam") == tree(tmp_path / "local")
    assert report(tmp_path / "beam") == report(tmp_path / "local")


@pytest.mark.parametrize(("args", "message"), [
    (["--beam-runner", "Fast"], "--beam-runner 'Fast' is not a Beam runner; use one of BundleBasedDirectRunner"),
    (["--beam-option", "direct_num_worker=2"], "Beam has no option direct_num_worker (did you mean direct_num_workers?)"),
    (["--beam-option", "runner=FlinkRunner"], "choose the runner with --beam-runner"),
    (["--beam-option", "=2"], "is not KEY=VALUE"),
])
def test_bad_beam_flags_are_usage_errors(tmp_path, args, message):
    write(tmp_path / "in" / "a.csv", "1\n")
    result = CliRunner().invoke(
        transform_command, [str(HALF_PLUS_THREE), str(tmp_path / "in"), str(tmp_path / "out"), "--runner", "beam", *args]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "out").exists()


def test_beam_flags_need_the_beam_runner(tmp_path):
    result = CliRunner().invoke(transform_command, ["m", "in", "out", "--beam-option", "direct_num_workers=2"])
    assert result.exit_code == 2 and "--beam-runner and --beam-option need --runner beam" in result.output


def test_runner_names_are_matched_loosely():
    assert BeamSettings("direct").flags() == ["--runner=DirectRunner"]
    assert BeamSettings("flinkrunner", ["flink_master=localhost:8081", "save_main_session"]).flags() == [
        "--runner=FlinkRunner", "--flink_master=localhost:8081", "--save_main_session",
    ]
