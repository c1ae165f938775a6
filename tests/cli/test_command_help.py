"""The repository's commands answer -h/--help with their usage before they set anything up,
and `scripts/setup` refuses an argument it does not know instead of installing something else."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

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


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The commands in a tree of their own: one that ignored --help would set up, re-pin or
    overwrite results there, never in the checkout."""
    root = tmp_path_factory.mktemp("commands")
    shutil.copytree(REPO / "scripts", root / "scripts")
    (root / "bench" / "results").mkdir(parents=True)
    shutil.copy2(REPO / "bench" / "run", root / "bench" / "run")
    (root / "bench" / "results" / "ceiling.json").write_text("{}")
    return root


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_prints_the_usage_and_runs_nothing(copy, command):
    before = sorted(p.name for p in copy.rglob("*"))
    for flag in ("--help", "-h"):
        # Past the help, each of these would set up, install, build or test: minutes, not seconds.
        done = subprocess.run([str(copy / command), "--quick", flag], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert COMMANDS[command] in done.stdout
        assert "set -euo pipefail" not in done.stdout and not done.stdout.startswith("#!") and done.stderr == ""
    assert sorted(p.name for p in copy.rglob("*")) == before  # nothing made: no .venv, no lock, no result
    assert (copy / "bench" / "results" / "ceiling.json").read_text() == "{}"


def test_setup_refuses_an_unknown_argument(copy):
    done = subprocess.run([str(copy / "scripts" / "setup"), "--al"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "unknown argument '--al'" in done.stderr and "--all" in done.stderr
