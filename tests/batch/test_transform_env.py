"""--env in a process that runs one job after another (a reused Spark Python worker): each job
sees its own keys, and what an earlier job changed comes back."""

from __future__ import annotations

import os

from tfservo.batch.run import apply_env


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
