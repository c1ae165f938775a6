"""inference.py handlers, bundle archives and remote bundles on a real `tfservo serve`."""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import textwrap
from pathlib import Path

import pytest
from conftest import SMC, TFS
from server_process import ServerProcess, run_cli

HALF_PLUS_THREE = SMC / "resources" / "models" / "half_plus_three"

KEYED_CSV = '''
import csv
import io

import requests


def handler(data, context):
    """Keyed CSV: 'id;value' lines in latin-1 → 'id;prediction' lines, through context.rest_uri."""
    text = data.read().decode("latin-1")
    rows = [row for row in csv.reader(io.StringIO(text), delimiter=";") if row]
    response = requests.post(context.rest_uri, json={"instances": [float(r[1]) for r in rows]})
    if response.status_code != 200:
        raise ValueError(response.json()["error"])
    lines = [f"{row[0]};{p}" for row, p in zip(rows, response.json()["predictions"])]
    return ("\\n".join(lines) + "\\n").encode("latin-1"), "text/csv; charset=latin-1"
'''

PAIR = '''
import json

from helper_lib import scale


def input_handler(data, context):
    body = data.read().decode("utf-8")
    if body == "boom":
        raise ValueError("boom: this handler refuses the body 'boom'")
    values = [scale(float(v)) for v in body.split()]
    return json.dumps({"instances": values})


def output_handler(response, context):
    if response.status_code != 200:
        raise ValueError(response.content.decode("utf-8"))
    doc = response.json()
    doc["context"] = {
        "model_name": context.model_name,
        "model_version": context.model_version,
        "method": context.method,
        "rest_uri": context.rest_uri,
        "custom_attributes": context.custom_attributes,
        "request_content_type": context.request_content_type,
        "accept_header": context.accept_header,
        "content_length": context.content_length,
    }
    return json.dumps(doc), "application/json"
'''


def copy_model(src: Path, dst: Path) -> Path:
    """Copy a read-only test model and make the copy writable."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".*"))
    for root, dirs, files in os.walk(dst):
        for name in dirs + files:
            p = os.path.join(root, name)
            os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR)
    os.chmod(dst, os.stat(dst).st_mode | stat.S_IWUSR)
    return dst


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture(scope="module")
def handler_bundle(tmp_path_factory) -> Path:
    """model.tar.gz of a multi-model bundle: keyed (handler), pair (input/output + lib), plain."""
    root = tmp_path_factory.mktemp("bundle") / "root"
    for name in ("keyed", "pair", "plain"):
        copy_model(HALF_PLUS_THREE, root / name)
    write(root / "keyed" / "code" / "inference.py", KEYED_CSV)
    write(root / "pair" / "code" / "inference.py", PAIR)
    write(root / "pair" / "code" / "lib" / "helper_lib.py", "def scale(v):\n    return v * 2\n")
    archive = root.parent / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for child in sorted(root.iterdir()):
            tar.add(child, arcname=child.name)
    return archive


@pytest.fixture(scope="module")
def handler_server(handler_bundle):
    with ServerProcess([str(handler_bundle)]) as server:
        yield server


def test_keyed_csv_handler_through_rest_uri(handler_server):
    body = "Müller-1;1.0\nßeta-2;2.0\nc-3;5.0\n".encode("latin-1")
    with handler_server.client() as c:
        r = c.post(
            "/invocations",
            content=body,
            headers={"Content-Type": "text/csv; charset=latin-1", "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=keyed"},
        )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/csv")
    assert r.content.decode("latin-1") == "Müller-1;3.5\nßeta-2;4.0\nc-3;5.5\n"


def test_input_output_handlers_get_the_container_context(handler_server):
    with handler_server.client() as c:
        r = c.post(
            "/invocations",
            content=b"1.0 2.0",
            headers={
                "Content-Type": "text/plain",
                "Accept": "application/json",
                "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=pair,tfs-model-version=123,x=1",
            },
        )
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["predictions"] == [4.0, 5.0]  # lib/helper_lib doubled the inputs
    ctx = doc["context"]
    assert ctx["model_name"] == "pair" and ctx["model_version"] == "123" and ctx["method"] == "predict"
    assert ctx["rest_uri"] == f"{handler_server.url}/v1/models/pair/versions/123:predict"
    assert ctx["custom_attributes"] == "tfs-model-name=pair,tfs-model-version=123,x=1"
    assert ctx["request_content_type"] == "text/plain" and ctx["content_length"] == 7


def test_handler_exception_is_500_and_server_keeps_serving(handler_server):
    with handler_server.client() as c:
        r = c.post("/invocations", content=b"boom", headers={
            "Content-Type": "text/plain", "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=pair"})
        assert r.status_code == 500
        assert "boom: this handler refuses" in r.json()["error"]
        r = c.post("/invocations", content=b"1.0", headers={
            "Content-Type": "text/csv", "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=plain"})
        assert r.status_code == 200 and r.json() == {"predictions": [3.5]}


def test_default_model_is_first_by_name(handler_server):
    """No tfs-model-name: the first model by name ('keyed') answers, through its handler."""
    with handler_server.client() as c:
        r = c.post("/invocations", content=b"a;1.0", headers={"Content-Type": "text/csv"})
    assert r.status_code == 200 and r.text == "a;3.5\n"


def test_invoke_cli_runs_the_same_path_in_process(handler_bundle):
    done = run_cli(["invoke", str(handler_bundle), "--model", "keyed", "-t", "text/csv"], input=b"k;2.0\n")
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"k;4.0\n"
    done = run_cli(["invoke", str(handler_bundle), "--model", "plain", "-t", "image/png"], input=b"x")
    assert done.returncode == 1 and b"Unsupported Media Type" in done.stdout


def test_inspect_prints_models_versions_signatures():
    done = run_cli(["inspect", str(TFS / "saved_model_half_plus_two_2_versions")])
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    assert "Version 124 (latest)" in out and "Version 123" in out
    assert "signature_def['regress_x_to_y']:" in out and "Method name is: tensorflow/serving/regress" in out
    assert "inputs['x'] tensor_info:" in out and "shape: (-1, 1)" in out


def test_broken_inference_py_stops_startup_naming_file_and_line(tmp_path):
    model = copy_model(HALF_PLUS_THREE, tmp_path / "m")
    write(model / "code" / "inference.py", "import json\n\ndef handler(data, context)\n    return data\n")
    server = ServerProcess([str(model)], timeout=120)
    with pytest.raises(RuntimeError) as err:
        server.start()
    assert server.proc.returncode != 0
    assert "inference.py" in str(err.value) and "line 3" in str(err.value)


def test_uninstallable_requirement_stops_startup(tmp_path):
    model = copy_model(HALF_PLUS_THREE, tmp_path / "m")
    write(model / "code" / "inference.py", "def handler(data, context):\n    return b'', 'text/plain'\n")
    write(model / "code" / "requirements.txt", "tfservo-no-such-package-exists==9.9.9\n")
    done = run_cli(["serve", str(model), "--port", "0", "--grpc-port", "0"], timeout=300)
    assert done.returncode != 0
    assert b"requirements.txt" in done.stderr


def test_failed_model_does_not_take_others_down(testdata):
    with ServerProcess([str(TFS / "bad_half_plus_two"), str(TFS / "saved_model_half_plus_three")]) as server:
        with server.client() as c:
            assert c.get("/ping").status_code == 503
            r = c.post("/v1/models/saved_model_half_plus_three:predict", json={"instances": [1.0]})
            assert r.json() == {"predictions": [3.5]}
            status = c.get("/v1/models/bad_half_plus_two").json()["model_version_status"][0]
            assert status["state"] == "END" and status["status"]["error_message"]
            r = c.post("/v1/models/bad_half_plus_two:predict", json={"instances": [1.0]})
            assert r.status_code == 404 and "bad_half_plus_two" in r.json()["error"]


def test_serve_bundle_from_s3(s3_endpoint, s3_bucket, handler_bundle):
    from s3_server import upload_file

    url = upload_file(s3_endpoint, s3_bucket, "models/model.tar.gz", str(handler_bundle))
    with ServerProcess([url]) as server, server.client() as c:
        r = c.post("/invocations", content=b"1.0", headers={
            "Content-Type": "text/csv", "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=plain"})
        assert r.json() == {"predictions": [3.5]}


def test_a_requirement_tfservo_already_imported_is_one_clear_error_in_every_mode(tmp_path):
    """code/requirements.txt pinning another version of a package the server has imported
    (Pillow, via TensorFlow's Keras): serve, invoke and transform all stop naming it."""
    import PIL
    from conftest import write_wheel

    model = copy_model(HALF_PLUS_THREE, tmp_path / "m")
    (model / "code").mkdir()
    wheel = write_wheel(model / "code", "pillow", "99.0", {"PIL/__init__.py": "__version__ = '99.0'\n"})
    write(model / "code" / "requirements.txt", f"./{wheel.name}\n")
    write(model / "code" / "inference.py", "import PIL\n\ndef handler(data, context):\n    return PIL.__version__, 'text/plain'\n")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"instances": [1.0]}')
    env = {"TFSERVO_REQUIREMENTS_DIR": str(tmp_path / "deps")}
    said = f"installs pillow 99.0, but pillow {PIL.__version__} is already imported"
    for args in (
        ["serve", str(model), "--port", "0", "--grpc-port", "0"],
        ["invoke", str(model)],
        ["transform", str(model), str(tmp_path / "in"), str(tmp_path / "out")],
    ):
        done = run_cli(args, timeout=300, env=env, input=b"{}")
        assert done.returncode != 0, args
        assert said.encode() in done.stderr + done.stdout, (args, done.stderr[-2000:])
        assert f"pin pillow=={PIL.__version__}".encode() in done.stderr + done.stdout
