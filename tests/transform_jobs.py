"""What the transform tests share: the container's half_plus_three model, the insurance flags,
one loaded service per test module, and small file helpers.

Use in a test module with `from transform_jobs import HALF_PLUS_THREE, INSURANCE, hp3  # noqa: F401`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import SMC

from tfservo.batch.loading import load_service
from tfservo.batch.state import REPORT_NAME, TransformSummary

HALF_PLUS_THREE = SMC / "resources" / "models" / "half_plus_three"
# `id,value` lines in, `id,prediction` lines out: the model sees only the value
INSURANCE = {
    "content_type": "text/csv",
    "split_type": "Line",
    "assemble_with": "Line",
    "input_filter": "$[1:]",
    "join_source": "Input",
    "output_filter": "$[0,-1]",
}


@pytest.fixture(scope="module")
def hp3():
    """half_plus_three loaded once for the module, as one `tfservo transform` process loads it."""
    service = load_service(str(HALF_PLUS_THREE))
    yield service
    service.close()


def write(path: Path, text: str | bytes) -> Path:
    """Write a file, making its folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def state(out: Path) -> Path:
    """The job's state location beside OUTPUT (description, failure report, dead letters)."""
    return Path(str(out) + ".tfservo-state")


def lines(path: Path) -> list[str]:
    """A text file's lines, without the last newline."""
    return path.read_text().split("\n")[:-1]


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root and its state location (the failure report aside: it holds times
    and paths) → its bytes."""
    return {
        prefix + str(p.relative_to(base)): p.read_bytes()
        for prefix, base in (("", root), ("state:", state(root)))
        for p in sorted(base.rglob("*"))
        if p.is_file() and p.name != REPORT_NAME
    }


def report(root: Path) -> dict | None:
    path = state(root) / REPORT_NAME
    if not path.exists():
        return None
    doc = json.loads(path.read_bytes())
    for dead in doc["dead_letters"]:
        dead["file"] = os.path.relpath(dead["file"], state(root))
    return {"failed_objects": doc["failed_objects"], "dead_letters": doc["dead_letters"]}


def counts(summary: TransformSummary) -> tuple:
    return (summary.objects, summary.done, summary.skipped, len(summary.failed), summary.records,
            [o.obj.rel for o in summary.failed], [(o.obj.rel, o.dead_letters) for o in summary.dead_lettered])


def insurance_input(root: Path) -> Path:
    write(root / "2024" / "quotes.csv", "".join(f"Q{i},{i}.5\n" for i in range(1, 301)))
    write(root / "2025" / "gaps.csv", "A1,1\n\nA3,3\n\n")
    write(root / "bad.csv", "B1,1.0\nB2,two\nB3,3.0\n")
    write(root / "empty.csv", "")
    return root
