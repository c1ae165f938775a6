"""How a failed batch splits (core.batch_split), through the one rule's users: the transform's
records, the pipeline adapters' elements (tests/batch/test_beam_handler.py) and the batcher's
callers (tests/models). A record that disagrees with its batch fails; a record that fails alone
fails alone; an overload fails the batch whole."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from transform_jobs import HALF_PLUS_THREE, write

from tfservo.core.batch_split import Disagrees, Failed, NotTried, isolate, run_split
from tfservo.core.errors import InvalidArgument, Unavailable

RAGGED = "a,1.0\nb,2.0\nQ9999,1.0,7.5\nd,3.0\n"
FLAGS = ["--content-type", "text/csv", "--split-type", "Line", "--assemble-with", "Line",
         "--input-filter", "$[1:]", "--join-source", "Input", "--output-filter", "$[0,-1]"]


def _sums(calls: list[list[str]]):
    """A 'model' over strings: a batch fails when its items differ in length or one is "no"."""

    def run(group: Sequence[str]) -> list[str]:
        calls.append(list(group))
        if any(item == "no" for item in group):
            raise InvalidArgument("no is refused")
        if len({len(item) for item in group}) > 1:
            raise InvalidArgument("every instance must have the same shape")
        return [item.upper() for item in group]

    return run


def test_records_that_disagree_fail_and_the_rest_run_together_again() -> None:
    calls: list[list[str]] = []
    outcomes = run_split(["ab", "cd", "xyz", "ef"], _sums(calls), structure=len)
    assert outcomes[:2] == ["AB", "CD"] and outcomes[3] == "EF"
    failed = outcomes[2]
    assert isinstance(failed, Failed) and isinstance(failed.error, Disagrees)
    assert "its instances are 3, the rest of its mini-batch's are 2" in str(failed.error)
    # the rest as one call, not one by one; the odd one alone only to tell its own error from disagreeing
    assert calls == [["ab", "cd", "xyz", "ef"], ["ab", "cd", "ef"], ["xyz"]]


def test_a_disagreeing_record_that_fails_alone_too_keeps_its_own_error_and_a_failing_majority_defines_nothing() -> None:
    outcomes = run_split(["ab", "cd", "no", "xyz"], _sums([]), structure=len)
    assert outcomes[0:2] == ["AB", "CD"] and isinstance(outcomes[3], Failed)
    assert str(outcomes[2].error) == "no is refused"  # type: ignore[union-attr]
    assert isinstance(outcomes[3].error, Disagrees)  # type: ignore[union-attr]
    # two records of one structure that each fail on their own do not make the third disagree
    outcomes = run_split(["no", "no", "xyz"], _sums([]), structure=len)
    assert [type(o).__name__ for o in outcomes] == ["Failed", "Failed", "str"] and outcomes[2] == "XYZ"


def test_a_record_that_fails_on_its_own_is_isolated_and_stopping_leaves_the_rest_untried() -> None:
    calls: list[list[str]] = []
    outcomes = run_split(["ab", "no", "cd"], _sums(calls), structure=len)
    assert outcomes[0] == "AB" and outcomes[2] == "CD"
    assert isinstance(outcomes[1], Failed) and str(outcomes[1].error) == "no is refused"
    stopped = run_split(["ab", "no", "cd"], _sums([]), structure=len, stop_at_first=True)
    assert stopped[0] == "AB" and isinstance(stopped[1], Failed) and isinstance(stopped[2], NotTried)


def test_an_overload_fails_the_batch_whole_and_a_tie_goes_to_the_earliest_structure() -> None:
    def overloaded(group: Sequence[str]) -> list[str]:
        raise Unavailable("model is unloading; retry the request")

    with pytest.raises(Unavailable):
        run_split(["ab", "cd"], overloaded, structure=len)
    calls: list[list[str]] = []
    outcomes = isolate(["xyz", "ab"], InvalidArgument("shapes"), _sums(calls), structure=len)
    assert outcomes[0] == "XYZ" and isinstance(outcomes[1], Failed)


def _transform(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    write(tmp_path / "in" / "rows.csv", RAGGED)
    command = [str(Path(sys.executable).with_name("tfservo")), "transform", str(HALF_PLUS_THREE),
               str(tmp_path / "in"), str(tmp_path / "out"), *FLAGS, *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_a_ragged_row_fails_its_object_naming_its_line(tmp_path: Path) -> None:
    """The issue's job: one row with an extra column in a MultiRecord mini-batch. /invocations
    refuses the same body (tests/core/test_parity.py); the transform must not answer the row."""
    done = _transform(tmp_path)
    assert done.returncode == 1, done.stderr
    assert "FAILED" in done.stderr and "line 3" in done.stderr and "Q9999" in done.stderr
    assert "its instances are x: float32 of shape [2]" in done.stderr
    assert not (tmp_path / "out" / "rows.csv.out").exists()
    report = json.loads((tmp_path / "out.tfservo-state" / "failures.json").read_text())
    assert "line 3" in json.dumps(report)


def test_skipped_ragged_rows_are_dead_lettered_and_the_others_answered(tmp_path: Path) -> None:
    done = _transform(tmp_path, "--on-record-error", "skip")
    assert done.returncode == 0, done.stderr
    assert "1 records dead-lettered" in done.stderr
    assert (tmp_path / "out" / "rows.csv.out").read_text() == "a,3.5\nb,4.0\n\nd,4.5\n"
    (dead,) = [json.loads(line) for path in (tmp_path / "out.tfservo-state").rglob("*.deadletter.jsonl")
               for line in path.read_text().splitlines()]
    assert "Q9999,1.0,7.5" in json.dumps(dead) and "its instances are" in json.dumps(dead)
