"""The capture writer in this process, on real files: every submitted line published, and a
destination folder removed while it writes made again."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from tfservo.capture.config import capture_config_from_dict
from tfservo.capture.writer import CaptureEvent, CaptureWriter


def _config(destination: Path):
    return capture_config_from_dict({
        "EnableCapture": True, "InitialSamplingPercentage": 100, "DestinationS3Uri": str(destination),
        "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
        "CaptureContentTypeHeader": {"JsonContentTypes": ["application/json"]},
    })


def _event(i: int) -> CaptureEvent:
    body = json.dumps({"instances": [[float(i)] * 2000]}).encode()  # ~20 KB: several writes a batch
    return CaptureEvent(body, "application/json", b'{"predictions": [%d]}' % i, "application/json", f"id-{i}",
                        time.time())


def _published(root: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(root.rglob("*.jsonl")) for line in path.read_text().splitlines()]


def test_every_submitted_line_is_published_once_in_order(tmp_path) -> None:
    counts: dict[str, int] = {}
    writer = CaptureWriter(_config(tmp_path), endpoint="ep", variant="v",
                           on_event=lambda kind, n: counts.__setitem__(kind, counts.get(kind, 0) + n))
    for i in range(300):
        writer.submit(_event(i))
    writer.close()
    lines = _published(tmp_path / "ep" / "v")
    assert [line["eventMetadata"]["inferenceId"] for line in lines] == [f"id-{i}" for i in range(300)]
    assert counts == {"captured": 300}
    assert not list(tmp_path.rglob(".*.tmp"))


def test_a_destination_removed_while_writing_is_made_again(tmp_path) -> None:
    writer = CaptureWriter(_config(tmp_path / "capture"), endpoint="ep", variant="v")
    for i in range(50):
        writer.submit(_event(i))
    deadline = time.monotonic() + 10
    while not list((tmp_path / "capture").rglob(".*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.05)  # the writer thread has written the first lines
    shutil.rmtree(tmp_path / "capture")
    time.sleep(1.1)  # past the writer's once-a-second disk check, which now finds no folder
    for i in range(50, 80):
        writer.submit(_event(i))
    writer.close()
    ids = {line["eventMetadata"]["inferenceId"] for line in _published(tmp_path / "capture" / "ep" / "v")}
    assert {f"id-{i}" for i in range(50, 80)} <= ids
