"""The asynchronous queue and runner in one process, on a real model: a request that waited past
its TTL ends in the failure location as expired; the cap on requests running at once holds
across queue handles; a request whose runner died is queued again and run once more; the
intake refuses what SageMaker refuses, naming the field."""

from __future__ import annotations

import json
import time

import pytest
from conftest import SMC

from tfservo.async_inference.config import AsyncConfig, read_async_config
from tfservo.async_inference.intake import AsyncCall, AsyncIntake
from tfservo.async_inference.queue import AsyncQueue, Submission
from tfservo.async_inference.runner import AsyncRunner
from tfservo.core.errors import InvalidArgument
from tfservo.core.settings import ConfigError, resolve_settings
from tfservo.server.loopback import open_service

MODEL = str(SMC / "resources" / "models" / "half_plus_three")


def submission(tmp_path, name: str, body: bytes = b"1.0\n", ttl: float = 600) -> Submission:
    source = tmp_path / f"{name}.csv"
    source.write_bytes(body)
    return Submission(name, str(source), "text/csv", None, None, str(tmp_path / "out" / f"{name}.out"),
                      str(tmp_path / "failed" / f"{name}-error.out"), ttl, 60)


def test_an_expired_request_fails_as_expired_and_a_live_one_runs(tmp_path):
    queue = AsyncQueue(str(tmp_path / "state"))
    config = AsyncConfig(output_path=str(tmp_path / "out"), failure_path=str(tmp_path / "failed"), max_concurrent=1)
    queue.submit(submission(tmp_path, "old", ttl=60), now=time.time() - 120)  # waited 2 minutes of its 1
    queue.submit(submission(tmp_path, "new"))
    events: list[str] = []
    with open_service(resolve_settings(paths=[MODEL], env={})) as service:
        runner = AsyncRunner(service, queue, config, endpoint="ep", region="us-east-1",
                             on_event=lambda event, seconds: events.append(event))
        for _ in range(2):
            claimed = queue.claim(1)
            assert claimed is not None
            runner.run(claimed)
    assert queue.get("old").state == "expired" and "RequestTTLSeconds" in queue.get("old").reason
    assert "Request expired" in (tmp_path / "failed" / "old-error.out").read_text()
    assert not (tmp_path / "out" / "old.out").exists()
    assert json.loads((tmp_path / "out" / "new.out").read_text()) == {"predictions": [3.5]}
    assert events == ["expired", "completed"]
    assert queue.counts() == {"queued": 0, "running": 0, "completed": 1, "failed": 0, "expired": 1}


def test_the_running_cap_holds_across_handles_and_a_dead_runners_request_runs_again(tmp_path):
    folder = str(tmp_path / "state")
    mine, other = AsyncQueue(folder), AsyncQueue(folder)
    for name in ("a", "b"):
        mine.submit(submission(tmp_path, name))
    taken = other.claim(1)
    assert taken is not None and taken.id == "a"
    assert mine.claim(1) is None  # one may run at once, whoever runs it
    other.me = "1:1"  # as if its process were gone (pid 1 started at another time)
    other._db.execute("UPDATE requests SET owner = '1:1' WHERE id = 'a'")
    again = mine.claim(1)
    assert again is not None and again.id == "a" and again.attempts == 2
    mine.finish("a", "completed")
    assert mine.claim(1).id == "b"


def test_the_intake_refuses_what_sagemaker_refuses(tmp_path):
    queue = AsyncQueue(str(tmp_path / "state"))
    intake = AsyncIntake(queue, AsyncConfig(output_path="s3://b/out", failure_path="s3://b/failed"),
                         input_root=str(tmp_path / "inputs"))
    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "x.csv").write_text("1\n")
    for call, message in (
        (AsyncCall(input_location="s3://b/in.csv", ttl_seconds="30"), "at 'requestTTLSeconds'"),
        (AsyncCall(input_location="s3://b/in.csv", timeout_seconds="3601"), "between 1 and 3600"),
        (AsyncCall(input_location="s3://b/in.csv", output_extension="s3://x"), "s3OutputPathExtension"),
        (AsyncCall(input_location="s3://b/in.csv", filename="a.b.c"), "'filename'"),
        (AsyncCall(input_location=str(tmp_path / "elsewhere.csv")), "outside --async-input-root"),
        (AsyncCall(input_location="https://b.s3.amazonaws.com/in.csv"), "give the object's s3:// URL"),
        (AsyncCall(), "InputLocation is required"),
    ):
        with pytest.raises(InvalidArgument, match=message):
            intake.submit(call)
    stored = intake.submit(AsyncCall(input_location=f"file://{tmp_path}/inputs/x.csv", inference_id="id-1",
                                     output_extension="team/a", filename="answer.json"))
    assert (stored.output, stored.failure) == ("s3://b/out/team/a/answer.json", "s3://b/failed/team/a/id-1-error.out")
    kept = intake.submit(AsyncCall(body=b"1.0\n"))  # a body of its own: kept in the state folder
    assert kept.input.startswith(str(tmp_path / "state" / "bodies")) and open(kept.input, "rb").read() == b"1.0\n"
    assert intake.submit(AsyncCall(input_location=f"file://{tmp_path}/inputs/x.csv", inference_id="id-1")).id == "id-1"


def test_the_config_is_read_as_sagemaker_writes_it(tmp_path):
    path = tmp_path / "async.json"
    path.write_text(json.dumps({"AsyncInferenceConfig": {"OutputConfig": {"S3OutputPath": "s3://b/out/"}}}))
    config = read_async_config(str(path))
    assert (config.output_path, config.failure_path, config.max_concurrent) == ("s3://b/out", "s3://b/out", 4)
    path.write_text(json.dumps({"OutputConfig": {}}))
    with pytest.raises(ConfigError, match="OutputConfig.S3OutputPath is required"):
        read_async_config(str(path))
    path.write_text(json.dumps({"OutputConfig": {"S3OutputPath": "s3://b/o"}, "ClientConfig": {
        "MaxConcurrentInvocationsPerInstance": 0}}))
    with pytest.raises(ConfigError, match="MaxConcurrentInvocationsPerInstance is 1 to 1000"):
        read_async_config(str(path))



def _open_queues(folders: list[str], barrier) -> None:  # type: ignore[no-untyped-def]
    for folder in folders:
        barrier.wait(60)
        AsyncQueue(folder).close()


def test_processes_opening_a_new_state_folder_at_once_all_open_it(tmp_path):
    """Workers of one server open the queue together at start; switching the file to WAL must not
    fail any of them with "database is locked" (it did, once in a CI run)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    folders = [str(tmp_path / f"state{n}") for n in range(30)]
    barrier = context.Barrier(6)
    processes = [context.Process(target=_open_queues, args=(folders, barrier)) for _ in range(6)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [p.exitcode for p in processes] == [0] * 6
