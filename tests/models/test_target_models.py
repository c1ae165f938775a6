"""Multi-model endpoints as SageMaker runs them: X-Amzn-SageMaker-Target-Model loads an archive
from the model root (a folder or an s3:// prefix) on first use, keeps it, unloads the least
recently used when memory runs short, loads once under concurrent first requests, and never
reads outside the root."""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from conftest import SMC, TFS, write_code
from server_process import ServerProcess

HALF_PLUS_TWO = TFS / "saved_model_half_plus_two_cpu"
HALF_PLUS_THREE = SMC / "resources" / "models" / "half_plus_three"
ANY_KEYS = {"aws_access_key_id": "a", "aws_secret_access_key": "b", "region_name": "us-east-1"}


def archive(path: Path, model_dir: Path, code: Path | None = None) -> Path:
    """A SageMaker MME archive: the model's version dirs at the top, code/ beside them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for version in sorted(p for p in model_dir.iterdir() if p.name.isdigit()):
            tar.add(version, arcname=version.name)
        if code is not None:
            tar.add(code, arcname="code")
    return path


def model_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file() and not f.name.startswith("."))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    for name in ("a", "b", "c", "d"):
        archive(root / "team" / f"{name}.tar.gz", HALF_PLUS_TWO)
    code = write_code(
        tmp_path_factory.mktemp("code") / "code",
        """
        import json

        def input_handler(data, context):
            return json.dumps({"instances": [float(v) for v in data.read().decode().split(",")]})

        def output_handler(response, context):
            return response.content, "application/json"
        """,
    )
    archive(root / "with-code.tar.gz", HALF_PLUS_TWO, code)
    (root / "not-an-archive.tar.gz").write_bytes(b"hello")
    outside = tmp_path_factory.mktemp("outside")
    archive(outside / "secret.tar.gz", HALF_PLUS_THREE)
    os.symlink(outside / "secret.tar.gz", root / "link.tar.gz")
    return root


@pytest.fixture(scope="module")
def server(root):
    # Room for two of the models (estimate: size on disk x 2) but not three.
    budget_mb = 5 * model_bytes(HALF_PLUS_TWO) / 2**20
    server = ServerProcess(
        ["--multi-model", "--model-root", str(root)], env={"TFSERVO_MME_MEMORY_MB": f"{budget_mb:.6f}"}
    ).start()
    yield server
    server.stop()


def call(server, target, body=b'{"instances": [1.0, 2.0]}', content_type="application/json"):
    client = boto3.client(
        "sagemaker-runtime", endpoint_url=server.url, config=Config(retries={"max_attempts": 1}), **ANY_KEYS
    )
    answer = client.invoke_endpoint(EndpointName="mme", TargetModel=target, Body=body, ContentType=content_type)
    return json.loads(answer["Body"].read())


def loaded(server) -> list[str]:
    with server.client() as http:
        return sorted(m.split("-")[0] for m in http.get("/models").json())


def load_lines(server, target: str) -> int:
    return sum(f"target model {target} loaded as" in line for line in server.lines)


def test_least_recently_used_models_make_room_and_load_again(server):
    assert call(server, "team/a.tar.gz") == {"predictions": [2.5, 3.0]}
    assert call(server, "team/b.tar.gz") == {"predictions": [2.5, 3.0]}
    assert loaded(server) == ["team_a", "team_b"]
    call(server, "team/a.tar.gz")  # a is now the most recently used
    call(server, "team/c.tar.gz")  # no room for three: b goes
    assert loaded(server) == ["team_a", "team_c"]
    assert any("team_b" in line and "unloaded to make room" in line for line in server.lines)
    assert call(server, "team/b.tar.gz") == {"predictions": [2.5, 3.0]}  # loads again, a goes
    assert loaded(server) == ["team_b", "team_c"]
    assert load_lines(server, "team/b.tar.gz") == 2 and load_lines(server, "team/a.tar.gz") == 1


def test_concurrent_first_requests_load_once(server):
    answers, errors = [], []

    def one():
        try:
            answers.append(call(server, "team/d.tar.gz"))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert answers == [{"predictions": [2.5, 3.0]}] * 8
    assert load_lines(server, "team/d.tar.gz") == 1


def test_an_archive_with_code_runs_its_handlers_and_the_container_route_takes_the_header(server):
    assert call(server, "with-code.tar.gz", b"1,2,3", "text/csv") == {"predictions": [2.5, 3.0, 3.5]}
    with server.client() as http:
        got = http.post(
            "/invocations", content=b"4", headers={"content-type": "text/csv", "x-amzn-sagemaker-target-model": "with-code.tar.gz"}
        )
    assert got.status_code == 200 and got.json() == {"predictions": [4.0]}


@pytest.mark.parametrize(
    ("target", "status", "says"),
    [
        ("../outside.tar.gz", 403, "without '..'"),
        ("/etc/passwd", 403, "relative path"),
        ("s3://bucket/x.tar.gz", 403, "relative path"),
        ("link.tar.gz", 403, "outside the model root"),
        ("missing.tar.gz", 404, "target model missing.tar.gz not found: there is no "),
        ("not-an-archive.tar.gz", 400, "cannot be loaded"),
        ("x" * 1100 + ".tar.gz", 400, "not valid"),
    ],
)
def test_targets_outside_the_root_or_broken_are_refused(server, target, status, says):
    with server.client() as http:
        got = http.post(
            "/invocations", content=b"[1.0]", headers={"content-type": "application/json", "x-amzn-sagemaker-target-model": target}
        )
    assert got.status_code == status, got.text
    assert says in got.json()["error"]
    if target == "missing.tar.gz":  # what is there instead
        assert "; the model root holds " in got.json()["error"]
    client = boto3.client("sagemaker-runtime", endpoint_url=server.url, config=Config(retries={"max_attempts": 1}), **ANY_KEYS)
    with pytest.raises((client.exceptions.ValidationError, client.exceptions.ModelError)):
        client.invoke_endpoint(EndpointName="mme", TargetModel=target, Body=b"[1.0]", ContentType="application/json")


def test_a_model_that_alone_does_not_fit_is_507(root):
    server = ServerProcess(["--multi-model", "--model-root", str(root)], env={"TFSERVO_MME_MEMORY_MB": "0.001"}).start()
    try:
        with server.client() as http:
            got = http.post(
                "/invocations", content=b"[1.0]",
                headers={"content-type": "application/json", "x-amzn-sagemaker-target-model": "team/a.tar.gz"},
            )
        assert got.status_code == 507 and "no other model loaded" in got.json()["error"]
    finally:
        server.stop()


def test_targets_load_from_an_s3_model_root(s3_bucket, tmp_path):
    s3 = boto3.client("s3")
    data = io.BytesIO(archive(tmp_path / "m.tar.gz", HALF_PLUS_THREE).read_bytes())
    s3.upload_fileobj(data, s3_bucket, "mme/models/m.tar.gz")
    server = ServerProcess(["--multi-model", "--model-root", f"s3://{s3_bucket}/mme/models/"]).start()
    try:
        assert call(server, "m.tar.gz") == {"predictions": [3.5, 4.0]}
        client = boto3.client("sagemaker-runtime", endpoint_url=server.url, **ANY_KEYS)
        with pytest.raises(client.exceptions.ValidationError,
                           match=f"there is no s3://{s3_bucket}/mme/models/nope.tar.gz"):
            client.invoke_endpoint(EndpointName="mme", TargetModel="nope.tar.gz", Body=b"[1]", ContentType="application/json")
    finally:
        server.stop()


def post_target(url: str, target: str, key: str | None = None, path: str = "/invocations"):
    import httpx

    headers = {"X-Amzn-SageMaker-Target-Model": target, "Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(url + path, content=b'{"instances": [1.0]}', headers=headers, timeout=60)


def test_a_target_model_load_needs_management_and_its_scope(root, tmp_path):
    """Loading an archive runs its code: with management off (other hosts can reach a server
    without keys) a Target-Model not loaded yet is refused, as is one loaded by an invoke-only
    key; a key with scope load (or manage) loads it, and then the invoke-only key calls it.
    SageMaker's own multi-model container (SAGEMAKER_MULTI_MODEL=true) loads on first use."""
    from tfservo.auth.keys import add_key

    with ServerProcess(["--multi-model", "--model-root", str(root), "--host", "0.0.0.0"]) as server:
        refused = post_target(server.url, "team/a.tar.gz")
        assert refused.status_code == 403 and "model management is off" in refused.json()["error"], refused.text
        runtime = post_target(server.url, "team/a.tar.gz", path="/endpoints/ep/invocations")
        assert runtime.status_code == 403 and runtime.headers["x-amzn-ErrorType"] == "AccessDeniedException"
        assert "refused forbidden" in server.output and "scope=load model=team/a.tar.gz" in server.output
    with ServerProcess(["--multi-model", "--model-root", str(root), "--host", "0.0.0.0"],
                       env={"SAGEMAKER_MULTI_MODEL": "true"}) as server:
        assert post_target(server.url, "team/a.tar.gz").status_code == 200

    keys = str(tmp_path / "keys.json")
    invoker, loader = add_key(keys, "invoker", ["invoke"]), add_key(keys, "loader", ["invoke", "load"])
    with ServerProcess(["--multi-model", "--model-root", str(root), "--api-keys", keys]) as server:
        refused = post_target(server.url, "team/b.tar.gz", invoker)
        assert refused.status_code == 403 and "needs scope load" in refused.json()["error"], refused.text
        assert post_target(server.url, "team/b.tar.gz", invoker, "/endpoints/ep/invocations").status_code == 403
        assert post_target(server.url, "team/b.tar.gz", loader).status_code == 200
        assert post_target(server.url, "team/b.tar.gz", invoker).status_code == 200  # loaded now: a call
        assert post_target(server.url, "team/b.tar.gz", invoker, "/endpoints/ep/invocations").status_code == 200
