"""The lean install: a wheel built with `python -m build` goes into a clean venv with only
requirements.lock's pins, serves the example model, and every feature it leaves out fails with
a message naming the extra that brings it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from server_process import REPO, ServerProcess

# modules only an extra brings (pyproject.toml's [project.optional-dependencies])
EXTRA_ONLY = ["apache_beam", "ray", "pyspark", "sklearn", "matplotlib", "sagemaker", "moto", "swagger_ui",
              "opentelemetry.sdk", "cloudevents", "pandas", "pytest"]


def _run(args: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def lean(tmp_path_factory) -> Path:
    """A clean venv with the wheel and requirements.lock (uv's cache makes it quick)."""
    root = tmp_path_factory.mktemp("lean")
    src = root / "src"
    src.mkdir()
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copy(REPO / "README.md", src)
    shutil.copytree(REPO / "tfservo", src / "tfservo", ignore=shutil.ignore_patterns("__pycache__"))
    done = _run([sys.executable, "-m", "build", "--wheel", "--installer", "uv", "--outdir", str(root / "dist"), str(src)])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = (root / "dist").glob("tfservo-*.whl")
    uv = str(Path(sys.executable).parent / "uv")
    venv = root / "venv"
    assert _run([uv, "venv", "-q", "--python", sys.executable, str(venv)]).returncode == 0
    done = _run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                 "-c", str(REPO / "requirements.lock"), str(wheel)])
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


def test_the_lean_venv_has_no_extra(lean):
    probe = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m.split('.')[0])))"
    done = _run([str(lean / "bin" / "python"), "-c", probe, *EXTRA_ONLY])
    assert done.returncode == 0 and done.stdout.split() == [], done.stdout + done.stderr


@pytest.mark.parametrize(("module", "extra"), [("tfservo.beam", "beam"), ("tfservo.ray", "ray"),
                                               ("tfservo.spark", "spark"), ("tfservo.sagemaker_sdk", "sagemaker")])
def test_importing_a_feature_without_its_extra_names_the_extra(lean, module, extra):
    done = _run([str(lean / "bin" / "python"), "-c", f"import {module}"])
    assert done.returncode == 1
    assert f"pip install 'tfservo[{extra}]'" in done.stderr.strip().splitlines()[-1]
    assert "ModuleNotFoundError" not in done.stderr


def test_the_wheel_serves_the_example_and_commands_name_missing_extras(lean, tmp_path):
    python, tfservo = str(lean / "bin" / "python"), str(lean / "bin" / "tfservo")
    done = _run([python, str(REPO / "examples" / "build_models.py"), str(tmp_path / "models")])
    assert done.returncode == 0, done.stderr[-2000:]
    model = str(tmp_path / "models" / "half_plus_ten")
    with ServerProcess([model], tfservo=tfservo) as server:
        answer = httpx.post(f"{server.url}/invocations", content=b"1.0\n2.0\n", headers={"Content-Type": "text/csv"})
        assert answer.json() == {"predictions": [10.5, 11.0]}
        docs = httpx.get(f"{server.url}/docs")
        assert docs.status_code == 404 and "pip install 'tfservo[ui]'" in docs.json()["error"]
        assert httpx.get(f"{server.url}/openapi.json").status_code == 200

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text("1.0\n2.0\n")
    done = _run([tfservo, "transform", model, str(tmp_path / "in"), str(tmp_path / "out"), "--content-type", "text/csv"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert b"10.5" in (tmp_path / "out" / "a.csv.out").read_bytes()
    for runner, extra in (("beam", "beam"), ("ray", "ray"), ("spark", "spark")):
        done = _run([tfservo, "transform", model, str(tmp_path / "in"), str(tmp_path / f"out-{runner}"),
                     "--runner", runner])
        assert done.returncode != 0 and f"pip install 'tfservo[{extra}]'" in done.stderr, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
    done = _run([tfservo, "evaluate", str(tmp_path / "out"), "--labels", str(tmp_path / "labels.csv")])
    assert done.returncode == 1 and "pip install 'tfservo[evaluate]'" in done.stderr and "Traceback" not in done.stderr
    done = _run([str(lean / "bin" / "tensorflow_model_server"), "--version"])
    assert done.returncode == 0, done.stderr[-2000:]
