"""How soon `tfservo transform --follow` picks up an object that lands: objects written one at a
time into a watched folder (each renamed into place whole, at a random phase of the poll), and
for each, the seconds until its .out is published, also counted in polls.

    python bench/follow_bench.py WORK RESULTS [--quick]     # writes RESULTS/follow.json

An object is taken once two listings a poll apart show it the same size, so the expected
pick-up is between one and two polls plus the time to transform it (issue 26: within two polls).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from servers import REPO, TFSERVO

POLL = 1.0


def measure(work: Path, results: Path, quick: bool) -> dict:
    count = 8 if quick else 30
    root = work / "follow"
    subprocess.run(["rm", "-rf", str(root)], check=True)
    inputs, out, staging = root / "in", root / "out", root / "staging"
    for folder in (inputs, staging):
        folder.mkdir(parents=True)
    subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "examples/build_models.py"), str(root / "models")],
                   check=True, capture_output=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    model = root / "models" / "half_plus_ten"
    log = open(root / "follow.log", "wb")
    proc = subprocess.Popen(
        [str(TFSERVO), "transform", str(model), str(inputs), str(out), "--content-type", "text/csv",
         "--split-type", "Line", "--progress", "none", "--follow", "--poll-seconds", str(POLL)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    rng = random.Random(0)
    pickups: list[float] = []
    try:
        _wait_for_start(root / "follow.log", proc)
        for i in range(count):
            time.sleep(rng.uniform(0.2, 1.2) * POLL)  # land at any phase of the poll
            staged = staging / f"{i:03d}.csv"
            staged.write_text("".join(f"{k}.5\n" for k in range(100)))
            landed = time.monotonic()
            staged.rename(inputs / staged.name)  # whole at once, as an S3 object appears
            answer = out / f"{staged.name}.out"
            while not answer.exists():
                if proc.poll() is not None or time.monotonic() - landed > 60:
                    raise RuntimeError(f"no answer for {staged.name}; see {root / 'follow.log'}")
                time.sleep(0.005)
            pickups.append(time.monotonic() - landed)
    finally:
        proc.terminate()
        proc.wait(60)
    pickups.sort()
    polls = [p / POLL for p in pickups]
    row = {"objects": count, "poll s": f"{POLL:g}", "median s": f"{statistics.median(pickups):.2f}",
           "p90 s": f"{pickups[int(0.9 * (count - 1))]:.2f}", "max s": f"{pickups[-1]:.2f}",
           "max polls": f"{max(polls):.2f}", "within two polls": f"{sum(p <= 2 for p in polls)}/{count}"}
    print(f"follow: pick-up median {row['median s']} s, max {row['max s']} s ({row['max polls']} polls)", flush=True)
    doc = {
        "title": "Following a prefix: seconds from an object landing to its .out (bench/follow_bench.py)",
        "rows": [row],
        "notes": [
            f"`tfservo transform half_plus_ten IN OUT --follow --poll-seconds {POLL:g}` on a local folder; "
            "each 100-line CSV object renamed into IN whole at a random phase of the poll, the next "
            "only after the previous one's .out appeared. Issue 26's bound: within two polls.",
        ],
    }
    (results / "follow.json").write_text(json.dumps(doc, indent=1))
    return doc


def _wait_for_start(log: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the run has loaded the model and listed INPUT once (its first log lines are out)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"transform --follow exited with {proc.returncode}; see {log}")
        if b"following " in log.read_bytes():  # its "following IN every Ns" line
            return
        time.sleep(0.2)
    raise RuntimeError(f"transform --follow did not start within {timeout:.0f} s; see {log}")


if __name__ == "__main__":
    measure(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), "--quick" in sys.argv[3:])
