"""SageMaker multi-model mode on a real `tfservo serve --multi-model` process.

The first servers mirror the SageMaker TFS container's test_multi_model_endpoint.py on its own
`mme/` models; the second checks model-root confinement and per-model vs. universal code/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
from conftest import SMC, write_code
from server_process import ServerProcess, run_cli

from tfservo.core.errors import InsufficientMemory, NotFound
from tfservo.core.memory import available_memory_bytes
from tfservo.core.settings import ConfigError, Settings, resolve_settings
from tfservo.service.factory import ModelService
from tfservo.service.invocation import error_result
from tfservo.service.multi_model import MultiModelEndpoint

MME = SMC / "resources" / "mme"
INSTANCES = {"instances": [1.0, 2.0, 5.0]}


def attrs(version: str | None = None, method: str = "predict") -> dict[str, str]:
    value = f"tfs-method={method}" + (f",tfs-model-version={version}" if version else "")
    return {"X-Amzn-SageMaker-Custom-Attributes": value}


def load(client: httpx.Client, name: str, url: str | Path) -> httpx.Response:
    return client.post("/models", json={"model_name": name, "url": str(url)})


def invoke(client: httpx.Client, name: str, body=INSTANCES, **headers) -> httpx.Response:
    return client.post(f"/models/{name}/invoke", json=body, headers=headers)


# -- the container's own expectations, on its mme/ models --------------------------------------


@pytest.fixture(scope="module")
def mme():
    with ServerProcess(["--model-root", str(MME)], env={"SAGEMAKER_MULTI_MODEL": "true"}) as proc:
        with proc.client() as client:
            yield client


def test_start_errors_are_clear(tmp_path):
    done = run_cli(["serve", "--multi-model", "--model-root", str(tmp_path / "none"), "--port", "0", "--grpc-port", "0"])
    assert done.returncode != 0
    assert f"multi-model root {tmp_path / 'none'} is not a directory" in done.stderr.decode()
    with pytest.raises(ConfigError, match="multi-model mode starts with no models, but PATH"):
        resolve_settings(
            paths=[str(MME / "half_plus_two")], host=None, port=None, grpc_port=None, max_request_mb=None,
            version_labels=[], intra_op_threads=None, inter_op_threads=None, log_level=None,
            env={"SAGEMAKER_MULTI_MODEL": "True"},
        )


def test_starts_with_no_models(mme):
    assert mme.get("/ping").status_code == 200
    r = mme.get("/models")
    assert r.status_code == 200 and r.json() == {}
    r = invoke(mme, "half_plus_three")
    assert r.status_code == 404 and r.json() == {"error": "Model half_plus_three is not loaded yet."}


def test_delete_unloaded_model(mme):
    r = mme.delete("/models/non-existing-model")
    assert r.status_code == 404 and r.json() == {"error": "Model non-existing-model is not loaded yet."}


def test_load_invoke_unload_invoke_again(mme):
    r = load(mme, "half_plus_three", MME / "half_plus_three")
    assert r.status_code == 200, r.text
    assert r.json()["success"].startswith("Successfully loaded model half_plus_three")
    assert invoke(mme, "half_plus_three").json() == {"predictions": [3.5, 4.0, 5.5]}

    r = mme.delete("/models/half_plus_three")
    assert r.status_code == 200 and r.json() == {"success": "Successfully unloaded model half_plus_three."}
    r = invoke(mme, "half_plus_three")
    assert r.status_code == 404 and r.json() == {"error": "Model half_plus_three is not loaded yet."}
    assert mme.get("/v1/models/half_plus_three").status_code == 404


def test_a_stopped_server_leaves_no_snapshot_of_its_models(tmp_path):
    """Loaded models are snapshotted under $TMPDIR; the worker leaves with os._exit (no atexit
    handlers), and a graceful stop still removes them."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = ServerProcess(["--multi-model", "--model-root", str(MME)], env={"TMPDIR": str(scratch)}).start()
    try:
        with proc.client() as client:
            assert load(client, "half_plus_three", MME / "half_plus_three").status_code == 200
        assert list(scratch.glob("tfservo-models-*/half_plus_three-*")), sorted(scratch.rglob("*"))
    finally:
        assert proc.stop() == 0, proc.output
    assert sorted(scratch.iterdir()) == []


def test_load_two_models_and_pick_versions(mme):
    assert load(mme, "half_plus_two", MME / "half_plus_two").status_code == 200
    assert load(mme, "hp3", "half_plus_three").status_code == 200  # relative to the model root
    r = invoke(mme, "half_plus_two")
    assert r.status_code == 200 and r.json() == {"predictions": [2.5, 3.0, 4.5]}
    for version in ("123", "124"):
        r = invoke(mme, "hp3", **attrs(version))
        assert r.status_code == 200 and r.json() == {"predictions": [3.5, 4.0, 5.5]}
    r = invoke(mme, "hp3", **attrs("999"))
    assert r.status_code == 404 and "Specific(hp3, 999)" in r.json()["error"]

    listing = mme.get("/models").json()
    assert sorted(listing) == ["half_plus_two", "hp3"]
    assert {v["version"] for v in listing["hp3"]["model_version_status"]} == {"123", "124"}
    one = mme.get("/models/hp3").json()["model"]
    assert one["url"] == "half_plus_three" and len(one["model_version_status"]) == 2
    # TF Serving's REST API and /invocations (named by attribute) reach loaded models too.
    r = mme.post("/v1/models/hp3/versions/123:predict", json={"instances": [1.0]})
    assert r.json() == {"predictions": [3.5]}
    named = {"X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=hp3"}
    r = mme.post("/invocations", json={"instances": [1.0]}, headers=named)
    assert r.status_code == 200 and r.json() == {"predictions": [3.5]}
    for name in ("half_plus_two", "hp3"):
        assert mme.delete(f"/models/{name}").status_code == 200


def test_load_one_model_two_times(mme):
    assert load(mme, "twice", MME / "half_plus_two").status_code == 200
    r = load(mme, "twice", MME / "half_plus_two")
    assert r.status_code == 409 and r.json() == {"error": "Model twice is already loaded."}
    assert mme.delete("/models/twice").status_code == 200


def test_load_non_existing_model(mme):
    url = str(MME / "non-existing")
    r = load(mme, "non-existing", url)
    assert r.status_code == 404
    assert r.json() == {"error": f"Could not find valid base path {url} for servable non-existing"}


def test_invalid_model_version(mme):
    url = str(MME / "invalid_version")
    r = load(mme, "invalid_version", url)
    assert r.status_code == 404
    assert r.json() == {"error": f"Could not find valid base path {url} for servable invalid_version"}


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"model_name": "model_name", "uri": "half_plus_two"}, "missing 'url'"),
        ({"url": "half_plus_two"}, "missing 'model_name'"),
        ({"model_name": "-bad", "url": "half_plus_two"}, "model_name '-bad' is not valid"),
        ({"model_name": "a/b", "url": "half_plus_two"}, "model_name 'a/b' is not valid"),
        ({"model_name": 7, "url": "half_plus_two"}, "model_name 7 is not valid"),
        (["half_plus_two"], "must be a JSON object"),
    ],
)
def test_bad_load_requests_are_400(mme, body, needle):
    r = mme.post("/models", json=body)
    assert r.status_code == 400 and needle in r.json()["error"]
    r = mme.post("/models", content=b"{not json")
    assert r.status_code == 400 and "not JSON" in r.json()["error"]


def test_invocations_without_model_name_is_400(mme):
    assert load(mme, "only", MME / "half_plus_two").status_code == 200
    try:
        r = mme.post("/invocations", json=INSTANCES)
        assert r.status_code == 400
        assert r.json()["error"].startswith("Invocation request does not contain model name")
    finally:
        mme.delete("/models/only")


# -- confinement and code/ ---------------------------------------------------------------------


HANDLER = """
    import json
    import requests

    def handler(data, context):
        answer = requests.post(context.rest_uri, data=data.read()).json()
        answer["handler"] = {which!r}
        answer["model"] = context.model_name
        return json.dumps(answer), "application/json"
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A model root: universal code/, models with and without their own code, and escapes."""
    base = tmp_path_factory.mktemp("mme")
    outside = base / "outside"
    shutil.copytree(MME / "half_plus_two", outside / "half_plus_two")
    write_code(outside / "code", "raise SystemExit('outside code must not be imported')\n")

    models = base / "models"
    write_code(models / "code", HANDLER.format(which="universal"))
    shutil.copytree(MME / "half_plus_three", models / "plain")
    shutil.copytree(MME / "half_plus_three", models / "own")
    write_code(models / "own" / "code", HANDLER.format(which="own"))

    # A link inside the root to another model's version dir is fine ...
    (models / "inner_link").mkdir()
    (models / "inner_link" / "00000001").symlink_to(models / "plain" / "00000123")
    # ... links leading out are not: the model dir itself, a version dir, one file, code/.
    (models / "dir_link").symlink_to(outside / "half_plus_two")
    (models / "version_link").mkdir()
    (models / "version_link" / "00000123").symlink_to(outside / "half_plus_two" / "00000123")
    shutil.copytree(MME / "half_plus_two", models / "file_link")
    index = models / "file_link" / "00000123" / "variables" / "variables.index"
    index.unlink()
    index.symlink_to(outside / "half_plus_two" / "00000123" / "variables" / "variables.index")
    shutil.copytree(MME / "half_plus_two", models / "code_link")
    (models / "code_link" / "code").symlink_to(outside / "code")
    return models


@pytest.fixture(scope="module")
def confined(root):
    with ServerProcess(["--multi-model", "--model-root", str(root)]) as proc, proc.client() as client:
        yield client


def test_universal_code_applies_to_models_without_their_own(confined, root):
    assert load(confined, "plain", root / "plain").status_code == 200
    r = invoke(confined, "plain")
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [3.5, 4.0, 5.5], "handler": "universal", "model": "plain"}


def test_own_code_applies_to_that_model_only(confined, root):
    assert load(confined, "own", root / "own").status_code == 200
    assert invoke(confined, "own").json()["handler"] == "own"
    assert invoke(confined, "plain").json()["handler"] == "universal"


def test_links_inside_the_root_are_followed(confined, root):
    r = load(confined, "inner_link", root / "inner_link")
    assert r.status_code == 200, r.text
    assert invoke(confined, "inner_link", **attrs("1")).json()["predictions"] == [3.5, 4.0, 5.5]


@pytest.mark.parametrize(
    "name, url, needle",
    [
        ("up", "{root}/../outside/half_plus_two", "contains '..'"),
        ("up_relative", "../outside/half_plus_two", "contains '..'"),
        ("elsewhere", str(MME / "half_plus_two"), "outside the model root"),
        ("dir_link", "{root}/dir_link", "outside the model root"),
        ("version_link", "{root}/version_link", "outside the model root"),
        ("file_link", "file_link", "variables.index, a link to"),
        ("code_link", "{root}/code_link", "code, a link to"),
        ("remote", "s3://bucket/model", "not a local path"),
    ],
)
def test_loads_outside_the_model_root_are_refused(confined, root, name, url, needle):
    r = load(confined, name, url.format(root=root))
    assert r.status_code == 403, r.text
    assert needle in r.json()["error"]
    assert name not in confined.get("/models").json()
    assert confined.get(f"/v1/models/{name}").status_code == 404
    assert invoke(confined, name).status_code == 404


# -- memory check (507), in-process: the check refuses before anything loads ------------------


def test_load_that_would_exhaust_memory_is_507(root):
    service = ModelService(Settings(multi_model=True))
    endpoint = MultiModelEndpoint(service, str(root), memory_factor=1e9)
    with pytest.raises(InsufficientMemory) as caught:
        endpoint.load("plain", "plain")
    assert caught.value.message.startswith("Memory exhausted: model plain needs about")
    assert error_result(caught.value).status == 507
    assert service.manager.model_names() == [] and not endpoint.is_loaded("plain")
    with pytest.raises(NotFound):
        endpoint.unload("plain")
    assert available_memory_bytes() > 0
