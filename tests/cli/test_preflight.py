"""A wrong bundle is answered before TensorFlow is imported and before any worker starts:
`serve`, `invoke`, `transform` and `inspect` each name the user's own path, file and line
(inside an archive: `model.tar.gz:code/inference.py, line N`). Time to the error is measured in
bench/time_to_error_bench.py; here, that TensorFlow was never imported."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from conftest import TFS
from server_process import run_observed

from tfservo.core.errors import BundleError
from tfservo.service.preflight import check_handler_source

HALF_PLUS_TWO = TFS / "saved_model_half_plus_two_cpu"

def run_cli(*args: str, tmp_path: Path) -> tuple[int, str, bool]:
    _, err, outcome = run_observed(args, cwd=tmp_path, timeout=120)
    return outcome["code"], err, outcome["tensorflow"]


def bundle_with(tmp_path: Path, source: str, name: str = "bundle") -> Path:
    bundle = tmp_path / name
    shutil.copytree(HALF_PLUS_TWO, bundle / "half_plus_two")
    (bundle / "code").mkdir()
    (bundle / "code" / "inference.py").write_text(textwrap.dedent(source))
    return bundle


def archive_of(bundle: Path) -> Path:
    archive = bundle.parent / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for child in sorted(bundle.iterdir()):
            tar.add(child, arcname=child.name)
    return archive


SYNTAX_ERROR = """
    import json

    def input_handler(data, context):
        return json.dumps({"instances": [1.0]}

    def output_handler(response, context):
        return response.content, "application/json"
"""
MISSING_OUTPUT = """
    def input_handler(data, context):
        return data.read()
"""


def commands(path: Path, tmp_path: Path) -> dict[str, tuple[str, ...]]:
    (tmp_path / "in").mkdir(exist_ok=True)
    return {
        "serve": ("serve", str(path), "--port", "0"),
        "invoke": ("invoke", str(path)),
        "transform": ("transform", str(path), str(tmp_path / "in"), str(tmp_path / "out")),
        "inspect": ("inspect", str(path)),
    }


@pytest.mark.parametrize("command", ["serve", "invoke", "transform", "inspect"])
def test_a_missing_path_is_answered_before_tensorflow(command, tmp_path) -> None:
    code, err, tensorflow = run_cli(*commands(tmp_path / "no-such-model", tmp_path)[command], tmp_path=tmp_path)
    assert code != 0 and not tensorflow, err
    assert f"model path {tmp_path / 'no-such-model'} does not exist" in err


@pytest.mark.parametrize("command", ["serve", "invoke", "transform", "inspect"])
def test_a_syntax_error_names_the_users_file_and_line(command, tmp_path) -> None:
    bundle = bundle_with(tmp_path, SYNTAX_ERROR)
    code, err, tensorflow = run_cli(*commands(bundle, tmp_path)[command], tmp_path=tmp_path)
    assert code != 0 and not tensorflow, err
    assert f"{bundle / 'code' / 'inference.py'}, line 5: SyntaxError: '(' was never closed" in err


def test_inside_an_archive_the_error_names_the_archive_and_its_member(tmp_path) -> None:
    archive = archive_of(bundle_with(tmp_path, SYNTAX_ERROR))
    code, err, tensorflow = run_cli("serve", str(archive), "--port", "0", tmp_path=tmp_path)
    assert code != 0 and not tensorflow, err
    assert f"{archive}:code/inference.py, line 5: SyntaxError: '(' was never closed" in err
    assert "/tmp/tfservo-bundle" not in err


@pytest.mark.parametrize("packed", [False, True], ids=["dir", "model.tar.gz"])
def test_a_missing_handler_function_is_named(packed, tmp_path) -> None:
    bundle = bundle_with(tmp_path, MISSING_OUTPUT)
    path = archive_of(bundle) if packed else bundle
    code, err, tensorflow = run_cli("invoke", str(path), tmp_path=tmp_path)
    assert code != 0 and not tensorflow, err
    shown = f"{path}:code/inference.py" if packed else str(bundle / "code" / "inference.py")
    assert f"{shown} defines input_handler but not output_handler" in err


def test_a_dir_without_models_and_an_archive_without_models(tmp_path) -> None:
    empty = tmp_path / "empty"
    (empty / "code").mkdir(parents=True)
    (empty / "code" / "inference.py").write_text("def handler(data, context):\n    return b'', 'text/plain'\n")
    code, err, tensorflow = run_cli("serve", str(empty), "--port", "0", tmp_path=tmp_path)
    assert code != 0 and not tensorflow and f"no models found in {empty}" in err, err
    archive = archive_of(empty)
    code, err, tensorflow = run_cli("serve", str(archive), "--port", "0", tmp_path=tmp_path)
    assert code != 0 and not tensorflow and f"no models found in {archive}" in err, err


def test_a_good_bundle_passes_and_is_served(tmp_path) -> None:
    """What passes the check loads as before (here through invoke, which goes on to TensorFlow)."""
    bundle = bundle_with(tmp_path, """
        def handler(data, context):
            return b"handled", "text/plain"
    """)
    done = subprocess.run([sys.executable, "-m", "tfservo", "invoke", str(archive_of(bundle))], input=b"{}",
                          capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == b"handled"


@pytest.mark.parametrize("source", [
    "from helpers import *\n",  # names unknowable without running it: the import decides
    "try:\n    from helpers import handler\nexcept ImportError:\n    def handler(data, context):\n        pass\n",
    "import helpers\nhandler = helpers.make()\n",
    "if True:\n    def input_handler(d, c): pass\n    def output_handler(r, c): pass\n",
    "globals()['handler'] = lambda data, context: None\n",
])
def test_handlers_bound_any_plain_way_pass(source) -> None:
    check_handler_source(source.encode(), "inference.py")


@pytest.mark.parametrize(("source", "message"), [
    ("def predict(data, context):\n    pass\n", "inference.py defines no handlers"),
    ("def output_handler(r, c):\n    pass\n", "defines output_handler but not input_handler"),
    ("def handler(data, context):\nreturn 1\n", "inference.py, line 2: SyntaxError: expected an indented block"),
    ("return 1\n", "inference.py, line 1: SyntaxError: 'return' outside function"),
])
def test_what_the_import_would_refuse_is_refused(source, message) -> None:
    with pytest.raises(BundleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_handler_source(source.encode(), "inference.py")


def test_an_import_error_inside_an_archive_names_the_archive_not_its_extracted_copy(tmp_path) -> None:
    """What only the import finds (here a module-level raise) still names the user's archive."""
    archive = archive_of(bundle_with(tmp_path, """
        raise RuntimeError("no config here")

        def handler(data, context):
            return b"", "text/plain"
    """))
    done = subprocess.run([sys.executable, "-m", "tfservo", "invoke", str(archive)], input=b"{}",
                          capture_output=True, timeout=180)
    err = done.stderr.decode()
    assert done.returncode != 0, err
    assert f"{archive}:code/inference.py, line 2: RuntimeError: no config here" in err, err
    assert "tfservo-bundle" not in err, err
