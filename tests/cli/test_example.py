"""The README's example model builds from code and answers through the in-process invoke path."""

from __future__ import annotations

import json
import subprocess
import sys

from server_process import REPO, run_cli


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
