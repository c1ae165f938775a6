"""The repository's commands answer -h/--help with their usage before they set anything up,
and `scripts/setup` refuses an argument it does not know instead of installing something else."""

from __future__ import annotations

import subprocess

import pytest
from server_process import REPO

# Each command, and a line of the usage its --help must print.
COMMANDS = {
    "bench/run": '--only "mlp: tfservo"',
    "scripts/setup": "scripts/setup --all",
    "scripts/test": "its arguments go to pytest",
    "scripts/test-image": "The container image test",
    "scripts/system-deps": "system-deps image",
    "scripts/build-image": "scripts/build-image [TAG]",
    "scripts/lock": "Re-pin the two locks",
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_prints_the_usage_and_runs_nothing(command):
    results = REPO / "bench" / "results"
    before = {p.name: p.stat().st_mtime_ns for p in results.glob("*.json")}
    for flag in ("--help", "-h"):
        # Past the help, each of these would set up, install, build or test: minutes, not seconds.
        done = subprocess.run([str(REPO / command), "--quick", flag], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert COMMANDS[command] in done.stdout
        assert "set -euo pipefail" not in done.stdout and not done.stdout.startswith("#!") and done.stderr == ""
    assert {p.name: p.stat().st_mtime_ns for p in results.glob("*.json")} == before


def test_setup_refuses_an_unknown_argument():
    done = subprocess.run([str(REPO / "scripts" / "setup"), "--al"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "unknown argument '--al'" in done.stderr and "--all" in done.stderr
