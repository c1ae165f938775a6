"""examples/beam_tfx_patterns.py runs with one command and prints the four TFX patterns' results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORDS = {"first": 1.0, "second": 2.0, "third": 3.0, "fourth": 4.0, "fifth": 5.0}


def expected_lines() -> set[str]:
    lines = set()
    for i, (key, x) in enumerate(RECORDS.items()):
        lines.add(f"[2 post-process] {x} * 5 = {5 * x}")
        lines.add(f"[3 keys] {key}: {x} -> {5 * x}")
        lines.add(f"[4a parallel x5] {key}: {x} -> {5 * x}")
        lines.add(f"[4a parallel x10] {key}: {x} -> {10 * x}")
        lines.add(f"[4b sequence x5 then x10] {key}: {x} -> {5 * x} -> {50 * x}")
        factor, model = (5, "multiply_five") if i % 2 == 0 else (10, "multiply_ten")
        lines.add(f"[4c per key] {key}: {x} -> {factor * x} ({model})")
    return lines


def test_example_prints_every_pattern(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "beam_tfx_patterns.py"), "--models-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert expected_lines() <= set(lines), sorted(expected_lines() - set(lines))
    predict = sorted(line for line in lines if line.startswith("[1 predict]"))
    assert len(predict) == 5 and all(line.endswith("(multiply_five/1)") for line in predict)
    assert len(lines) == 5 * 7  # nothing printed twice
    assert (tmp_path / "multiply_five" / "00000001" / "saved_model.pb").is_file()
