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
        # a burst, killed while it is being worked through: written aside, then moved in at once
        # (written in place one by one, a quick follower kept pace and was done before the kill)
        staging = tmp_path / "staging"
        for i in range(BURST):
            write(staging / f"{i:02d}.csv", "".join(f"{i}.{k}\n" for k in range(3000)))
        (inputs / "burst").mkdir()
        for i in range(BURST):
            os.replace(staging / f"{i:02d}.csv", inputs / "burst" / f"{i:02d}.csv")
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


def test_follow_reports_backlog_and_lag_in_its_log_and_as_prometheus_metrics(tmp_path):
    import re

    import httpx

    inputs, out, log = tmp_path / "in", tmp_path / "out", tmp_path / "follow.log"
    inputs.mkdir()
    proc = subprocess.Popen([TFSERVO, "transform", str(HALF_PLUS_THREE), str(inputs), str(out), *FLAGS, "--follow",
                             "--poll-seconds", "0.3", "--metrics-port", "0"],
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
    try:
        wait_for(lambda: "follow metrics on" in log.read_text(), what="the metrics line")
        url = re.search(r"follow metrics on (http://\S+)", log.read_text())[1]
        for name in ("a", "b", "c"):
            write(inputs / f"{name}.csv", "1.0\n2.0\n")
        wait_for(lambda: len(outs(out)) == 3, what="three answers")

        def scraped() -> dict[str, float]:
            text = httpx.get(url, timeout=10).text
            return {m[1]: float(m[2]) for m in re.finditer(r"^(tfservo_follow_\S+) (\S+)$", text, re.M)}

        wait_for(lambda: scraped().get("tfservo_follow_backlog_objects") == 0.0, what="an empty backlog")
        metrics = scraped()
        assert metrics['tfservo_follow_objects_total{outcome="done"}'] == 3.0
        assert metrics["tfservo_follow_records_total"] == 6.0
        assert metrics["tfservo_follow_lag_seconds"] == 0.0 and metrics["tfservo_follow_polls_total"] > 1
        assert re.search(r"follow: backlog [1-3] object\(s\), the oldest listed [0-9.]+s ago; transforming", log.read_text())
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-2000:]
    done = subprocess.run([TFSERVO, "transform", str(HALF_PLUS_THREE), str(inputs), str(tmp_path / "o2"), *FLAGS,
                           "--metrics-port", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--metrics-port needs --follow" in done.stderr
