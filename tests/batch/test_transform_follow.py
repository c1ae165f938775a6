"""`tfservo transform --follow`: objects landing over time are transformed as they come; killed
with -9 and started again, then stopped with SIGTERM (the objects in flight finished), every
object's .out is there once and byte-equal to a batch run's."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from server_process import TFSERVO
from transform_jobs import HALF_PLUS_THREE, write

BURST = 60
FLAGS = ["--content-type", "text/csv", "--split-type", "Line", "--assemble-with", "Line", "--progress", "none"]


def follow(inputs: Path, out: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([TFSERVO, "transform", str(HALF_PLUS_THREE), str(inputs), str(out), *FLAGS, "--follow",
                             "--poll-seconds", "0.3"], stdout=subprocess.DEVNULL, stderr=open(log, "ab"))


def outs(out: Path) -> list[str]:
    return sorted(p.name for p in out.rglob("*") if p.is_file())


def wait_for(check, timeout: float = 120.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.1)


def test_follow_takes_new_objects_as_they_land_once_each_across_kill_and_restart(tmp_path):
    inputs, out, log = tmp_path / "in", tmp_path / "out", tmp_path / "follow.log"
    inputs.mkdir()
    first = follow(inputs, out, log)
    try:
        write(inputs / "early.csv", "1.0\n2.0\n")
        wait_for(lambda: (out / "early.csv.out").exists(), what="the first object's answer")
        for i in range(BURST):  # a burst, killed while it is being worked through
            write(inputs / "burst" / f"{i:02d}.csv", "".join(f"{i}.{k}\n" for k in range(3000)))
        wait_for(lambda: any((out / "burst").glob("*.out")) if (out / "burst").exists() else False,
                 what="the burst to start")
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    killed_at = len(list((out / "burst").glob("*.out")))
    second = follow(inputs, out, log)
    try:
        wait_for(lambda: len(list((out / "burst").glob("*.out"))) == BURST, what="the rest of the burst")
        write(inputs / "late.csv", "5.0\n")
        wait_for(lambda: (out / "late.csv.out").exists(), what="an object that landed later")
    finally:
        second.send_signal(signal.SIGTERM)
        code = second.wait(60)
    stderr = log.read_text()
    assert code == 0, stderr[-3000:]
    assert "stopping once the objects in flight are done" in stderr and "tfservo transform:" in stderr
    assert killed_at < BURST, "the burst was done before the kill; nothing was tested"
    batch = tmp_path / "batch"
    done = subprocess.run([TFSERVO, "transform", str(HALF_PLUS_THREE), str(inputs), str(batch), *FLAGS],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert outs(out) == outs(batch) and len(outs(out)) == BURST + 2  # each once, nothing partial left
    for name in outs(batch):
        found = next(out.rglob(name))
        assert found.read_bytes() == next(batch.rglob(name)).read_bytes(), name
    assert os.path.exists(f"{out}.tfservo-state")
