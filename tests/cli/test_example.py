"""The README's example model builds from code and answers through the in-process invoke path."""

from __future__ import annotations

import json
import subprocess
import sys

from server_process import REPO, run_cli, set_up


def test_example_model_builds_and_answers(tmp_path):
    subprocess.run([sys.executable, str(REPO / "examples" / "build_models.py"), str(tmp_path)], check=True)
    done = run_cli(["invoke", str(tmp_path / "half_plus_ten"), "-t", "text/csv"], input=b"1.0\n2.0\n")
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout) == {"predictions": [10.5, 11.0]}
    done = run_cli(
        ["invoke", str(tmp_path / "half_plus_ten"), "-c", "tfs-method=regress"],
        input=b'{"signature_name": "regress_x_to_y", "examples": [{"x": 4}]}',
    )
    assert done.returncode == 0 and b"12.0" in done.stdout


def test_serve_example_tours_only_once_it_answers_and_says_when_its_port_is_taken(tmp_path):
    """The README's first command: with its port taken it says so and stops; else its tour is
    printed once the server answers, and the tour's requests work."""
    import os
    import signal
    import socket
    import time

    import httpx

    script = str(REPO / "scripts" / "serve-example")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([script], env={**os.environ, "PORT": str(port)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and f"port {port} is already in use" in done.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with open(tmp_path / "server.log", "w") as log:
        proc = subprocess.Popen(set_up([str(script), "--grpc-port", "0"], ctrl_c=True), env={**os.environ, "PORT": str(port)},
                                stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        deadline = time.monotonic() + 600
        for line in proc.stdout:
            if "tfservo is serving" in line:
                break
            assert time.monotonic() < deadline
        else:
            raise AssertionError(f"no tour: {(tmp_path / 'server.log').read_text()[-2000:]}")
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/ping").status_code == 200  # answering when the tour is printed
        answer = httpx.post(f"{base}/invocations", content=b"1.0\n2.0\n5.0", headers={"Content-Type": "text/csv"})
        assert answer.json() == {"predictions": [10.5, 11.0, 12.5]}
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0 or proc.returncode in (-signal.SIGINT, 130, 143)


def test_serve_example_help_shows_serves_options_and_succeeds():
    """Its arguments go to `tfservo serve`: --help prints serve's usage and exits 0, not as a failure."""
    import os

    done = subprocess.run([str(REPO / "scripts" / "serve-example"), "--help"], env={**os.environ, "PORT": "0"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Usage: tfservo serve" in done.stdout and "tfservo is serving" not in done.stdout
