"""--env in a process that runs one job after another (a reused Spark Python worker): each job
sees its own keys, and what an earlier job changed comes back; a cluster worker's share of
the machine."""

from __future__ import annotations

import dataclasses
import os

from transform_jobs import HALF_PLUS_THREE

from tfservo.batch.engines.distributed import on_cores
from tfservo.batch.job import TransformJob
from tfservo.batch.loading import apply_env, load_service


def test_a_later_jobs_env_replaces_an_earlier_ones(monkeypatch) -> None:
    monkeypatch.setenv("TFSERVO_TEST_KEPT", "machine")
    monkeypatch.delenv("TFSERVO_TEST_A", raising=False)
    monkeypatch.delenv("TFSERVO_TEST_B", raising=False)
    try:
        apply_env({"TFSERVO_TEST_A": "1", "TFSERVO_TEST_KEPT": "job-a"})
        assert (os.environ["TFSERVO_TEST_A"], os.environ["TFSERVO_TEST_KEPT"]) == ("1", "job-a")
        apply_env({"TFSERVO_TEST_B": "2"})
        assert "TFSERVO_TEST_A" not in os.environ and os.environ["TFSERVO_TEST_B"] == "2"
        assert os.environ["TFSERVO_TEST_KEPT"] == "machine"  # the earlier job's value taken back
    finally:
        apply_env({})
    assert "TFSERVO_TEST_B" not in os.environ and os.environ["TFSERVO_TEST_KEPT"] == "machine"


def test_a_cluster_worker_runs_as_many_calls_and_model_threads_as_it_owns_cores(tmp_path) -> None:
    """A Ray actor or Spark task owning one CPU answers one request at a time with one TensorFlow
    intra-op thread; --max-concurrent-transforms and SAGEMAKER_TFS_INTRA_OP_PARALLELISM still win."""
    job = TransformJob(str(HALF_PLUS_THREE), str(tmp_path), str(tmp_path / "out"))
    assert job.concurrency == (os.cpu_count() or 1) and on_cores(job, 1).concurrency == 1
    assert on_cores(dataclasses.replace(job, max_concurrent_transforms=4), 1).concurrency == 4
    assert on_cores(job, None) is job
    for env, cores, threads in (({}, 1, 1), ({}, None, 0), ({"SAGEMAKER_TFS_INTRA_OP_PARALLELISM": "3"}, 1, 3)):
        service = load_service(str(HALF_PLUS_THREE), env, cores=cores)
        try:
            assert service.settings.intra_op_threads == threads, (env, cores)
        finally:
            service.close()
