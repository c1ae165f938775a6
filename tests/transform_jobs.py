"""What the transform tests share: the container's half_plus_three model, the insurance flags,
one loaded service per test module, and small file helpers.

Use in a test module with `from transform_jobs import HALF_PLUS_THREE, INSURANCE, hp3  # noqa: F401`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SMC

from tfservo.transform.run import load_service

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
