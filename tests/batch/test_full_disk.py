"""A transform whose output disk fills: the objects that could not be written fail (named in
the failure report, the run's exit non-zero) and the run ends — it does not hang — and a rerun
once space returns writes the rest."""

from __future__ import annotations

import json

from small_disk import resize, small_disk
from transform_jobs import HALF_PLUS_THREE, INSURANCE, hp3, state, write  # noqa: F401

from tfservo.batch.engines.run import run_transform
from tfservo.batch.job import TransformJob
from tfservo.batch.state import REPORT_NAME


def test_a_full_output_disk_fails_the_objects_it_cannot_hold_and_a_rerun_finishes(hp3, tmp_path):
    source = tmp_path / "in"
    for i in range(30):
        write(source / f"part-{i:02d}.csv", "".join(f"Q{i}-{j},{j}.5\n" for j in range(2000)))
    with small_disk(tmp_path / "disk", "128k") as out:
        job = TransformJob(model=str(HALF_PLUS_THREE), input=str(source), output=str(out), **INSURANCE)
        first = run_transform(job, service=hp3, progress="none")  # returns: nothing hangs
        assert first.failed and first.done + len(first.failed) == 30, (first.done, len(first.failed))
        failed = json.loads((state(out) / REPORT_NAME).read_bytes())["failed_objects"]
        assert len(failed) == len(first.failed)
        assert all("No space left on device" in f["error"] for f in failed), failed[:2]
        written = sorted(p.name for p in out.iterdir() if p.name.endswith(".out"))
        assert len(written) == first.done  # no half-written output beside them
        assert not [p.name for p in out.rglob("*") if not p.name.endswith(".out") and p.is_file()
                    and not p.name.startswith("_tfservo")]

        resize(out, "8m")
        second = run_transform(job, service=hp3, progress="none")
        assert second.ok and second.done == len(first.failed) and second.skipped == first.done
        assert len([p for p in out.iterdir() if p.name.endswith(".out")]) == 30
