"""`tfservo invoke` answered by a `tfservo serve` already serving the bundle: the request goes to
that server (no TensorFlow imported, no model loaded in the invoking process), unless the server
would answer with code older than the bundle's, or --no-reuse; a stopped server is not asked."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TFS, handler_bundle
from server_process import ServerProcess, run_observed, serving_pids

from tfservo.server.registry import registered

WHOAMI = """
    import os

    def handler(data, context):
        return f"{os.getpid()} {data.read().decode()}", "text/plain"
"""

def invoke(bundle: Path, *flags: str) -> tuple[str, str, dict]:
    """One `tfservo invoke` in a fresh interpreter: its answer, stderr, and {code, tensorflow, pid}."""
    return run_observed(["invoke", str(bundle), "-t", "text/plain", *flags], input=b"hello")


@pytest.fixture
def bundle(tmp_path) -> Path:
    root = handler_bundle(tmp_path, WHOAMI)
    return root


def test_a_running_server_with_reload_answers_invoke(bundle) -> None:
    with ServerProcess([str(bundle), "--reload"]) as server:
        workers = serving_pids(server.lines)
        answer, err, outcome = invoke(bundle)
        assert outcome["code"] == 0 and not outcome["tensorflow"], err
        pid, echoed = answer.split(" ", 1)
        assert int(pid) in workers and echoed == "hello", answer
        assert f"answered by the server at {server.url}" in err
        # --no-reuse: this process loads the bundle and answers itself
        answer, err, outcome = invoke(bundle, "--no-reuse")
        assert outcome["code"] == 0 and outcome["tensorflow"], err
        assert int(answer.split(" ", 1)[0]) == outcome["pid"] and "answered by the server" not in err
        server_pid = server.proc.pid
    assert not [r for r in registered() if r.pid == server_pid], "a stopped server stays registered"
    answer, err, outcome = invoke(bundle)  # stopped: loaded here again
    assert outcome["code"] == 0 and int(answer.split(" ", 1)[0]) == outcome["pid"], err


def test_a_server_without_reload_is_not_used_once_the_bundle_changed(bundle) -> None:
    with ServerProcess([str(bundle)]) as server:
        assert int(invoke(bundle)[0].split(" ", 1)[0]) in serving_pids(server.lines)  # unchanged: reused
        script = bundle / "code" / "inference.py"
        time.sleep(0.05)
        script.write_text(script.read_text().replace('f"{os.getpid()} ', 'f"{os.getpid()} edited '))
        os.utime(script)
        answer, err, outcome = invoke(bundle)
        assert outcome["code"] == 0 and "answered by the server" not in err, err
        assert answer == f"{outcome['pid']} edited hello"  # the edited handler, loaded here


def test_a_server_with_keys_is_not_registered(bundle, tmp_path) -> None:
    keys = tmp_path / "keys"
    made = subprocess.run([sys.executable, "-m", "tfservo", "keys", "new", "--file", str(keys), "--name", "ci", "--scope", "invoke"],
                          capture_output=True, timeout=60)
    assert made.returncode == 0, made.stderr
    with ServerProcess([str(TFS / "saved_model_half_plus_two_cpu"), "--api-keys", str(keys)]) as server:
        assert not [r for r in registered() if r.pid == server.proc.pid]
