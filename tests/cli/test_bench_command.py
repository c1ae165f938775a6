"""The benchmark's one command answers --help with its usage, before it sets anything up."""

from __future__ import annotations

import subprocess

from server_process import REPO


def test_bench_run_help_prints_usage_and_touches_nothing():
    results = REPO / "bench" / "results"
    before = {p.name: p.stat().st_mtime_ns for p in results.glob("*.json")}
    for flag in ("--help", "-h"):
        done = subprocess.run([str(REPO / "bench" / "run"), "--quick", flag], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert "./bench/run --quick" in done.stdout and '--only "mlp: tfservo"' in done.stdout
        assert "set -euo pipefail" not in done.stdout and done.stderr == ""
    assert {p.name: p.stat().st_mtime_ns for p in results.glob("*.json")} == before
