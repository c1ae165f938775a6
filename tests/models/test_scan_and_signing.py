"""Models checked before they run: `tfservo scan` names graph ops that read or write files or run
Python (with the function holding them), links out of the model and the bundle's code with its
SHA-256; loading warns about them for a local path and refuses them for models that arrive through
the management API, a Target-Model header or s3://. Signed bundles (`tfservo sign`): with
--require-signature an unsigned, altered or later-added file refuses the load, in every mode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from conftest import TFS, write_code
from server_process import ServerProcess, run_cli

HALF_PLUS_TWO = TFS / "saved_model_half_plus_two_cpu"
ANY_KEYS = {"aws_access_key_id": "a", "aws_secret_access_key": "b", "region_name": "us-east-1"}
INSTANCES = {"instances": [1.0, 2.0]}

RISKY = '''
import sys
import tensorflow as tf

class PyFunc(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def serve(self, x):
        y = tf.py_function(lambda t: t * 2.0, [x], tf.float32)
        y.set_shape(x.shape)
        return {"y": y}

class Reads(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def serve(self, x):
        one = tf.strings.to_number(tf.strings.substr(tf.io.read_file("/etc/hostname"), 0, 0) + "1")
        return {"y": x + one}

root = sys.argv[1]
for name, module in (("pyfunc", PyFunc()), ("reads", Reads())):
    tf.saved_model.save(module, f"{root}/{name}/1", signatures={"serving_default": module.serve})
'''


@pytest.fixture(scope="module")
def risky(tmp_path_factory) -> Path:
    """Two SavedModels that do more than compute: one runs Python (EagerPyFunc), one reads a file."""
    root = tmp_path_factory.mktemp("risky")
    script = root / "build.py"
    script.write_text(RISKY)
    subprocess.run([sys.executable, str(script), str(root)], check=True, capture_output=True, timeout=300)
    return root


def archive(path: Path, model_dir: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for version in sorted(p for p in model_dir.iterdir() if p.name.isdigit()):
            tar.add(version, arcname=version.name)
    return path


def test_scan_names_what_a_graph_does_beyond_computing_and_lists_code_with_its_hash(risky, tmp_path):
    done = run_cli(["scan", str(risky / "pyfunc")])
    out = done.stdout.decode()
    assert done.returncode == 1, out + done.stderr.decode()
    assert "model pyfunc version 1: op EagerPyFunc 'EagerPyFunc' in function __inference_serve_" in out
    assert "runs Python code" in out
    reads = json.loads(run_cli(["scan", str(risky / "reads"), "--json"]).stdout)
    [finding] = reads["findings"]
    assert finding["kind"] == "op" and finding["what"].startswith("op ReadFile") and "reads files" in finding["what"]

    # the shared SavedModels, as they are, and a bundle with code: nothing beyond computing, code listed
    bundle = tmp_path / "bundle"
    shutil.copytree(HALF_PLUS_TWO, bundle / "model")
    write_code(bundle / "code", "def handler(data, context):\n    return data.read(), 'application/json'\n")
    (bundle / "model" / "00000123" / "assets").mkdir(exist_ok=True)
    clean = run_cli(["scan", str(bundle)])
    text = clean.stdout.decode()
    assert clean.returncode == 0, text + clean.stderr.decode()
    assert "Beyond computing: nothing found" in text
    import hashlib

    digest = hashlib.sha256((bundle / "code" / "inference.py").read_bytes()).hexdigest()
    assert f"code/inference.py sha256 {digest}" in text

    # a link out of the model (an asset naming the host's files) is a finding
    os.symlink("/etc/passwd", bundle / "model" / "00000123" / "assets" / "vocab.txt")
    linked = run_cli(["scan", str(bundle)])
    assert linked.returncode == 1 and "assets/vocab.txt links to '/etc/passwd', outside the model" in linked.stdout.decode()


def test_scan_opens_an_archive_within_the_limits_serve_would_apply(tmp_path):
    """TFSERVO_ARCHIVE_MAX_FILES bounds `tfservo scan` as it bounds serve: a model.tar.gz
    over it is refused before anything is extracted."""
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(HALF_PLUS_TWO, arcname="model")
    assert run_cli(["scan", str(archive)]).returncode == 0
    refused = run_cli(["scan", str(archive)], env={"TFSERVO_ARCHIVE_MAX_FILES": "2"})
    err = refused.stderr.decode()
    assert refused.returncode == 1 and "more than 2 members" in err and "TFSERVO_ARCHIVE_MAX_FILES" in err, err
    assert "Traceback" not in err and not refused.stdout


def test_a_local_path_is_warned_about_and_served(risky):
    with ServerProcess([str(risky / "reads"), "--no-supervisor"]) as proc, proc.client() as http:
        got = http.post("/v1/models/reads:predict", json=INSTANCES)
        assert got.status_code == 200 and got.json() == {"predictions": [2.0, 3.0]}, got.text
    [warning] = [line for line in proc.lines if "can do more than compute" in line]
    assert " WARNING " in warning and "op ReadFile" in warning and "scan policy warn" in warning


def test_the_management_api_and_target_model_loads_refuse_it_unless_the_policy_allows(risky, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(risky / "pyfunc", root / "pyfunc")
    shutil.copytree(HALF_PLUS_TWO, root / "plain")
    archive(root / "pyfunc.tar.gz", risky / "pyfunc")
    with ServerProcess(["--multi-model", "--model-root", str(root)]) as proc, proc.client() as http:
        refused = http.post("/models", json={"model_name": "pyfunc", "url": str(root / "pyfunc")})
        assert 400 <= refused.status_code < 500, refused.text
        error = refused.json()["error"]
        assert "op EagerPyFunc" in error and "It arrived through the management API" in error, error
        assert "--scan-policy warn" in error and "TFSERVO_SCAN_POLICY=warn" in error, error
        assert http.post("/models", json={"model_name": "plain", "url": str(root / "plain")}).status_code == 200
        client = boto3.client("sagemaker-runtime", endpoint_url=proc.url, config=Config(retries={"max_attempts": 1}),
                              **ANY_KEYS)
        with pytest.raises(ClientError) as target:
            client.invoke_endpoint(EndpointName="mme", TargetModel="pyfunc.tar.gz", Body=b"[1.0]",
                                   ContentType="application/json")
        message = target.value.response["Error"]["Message"]
        assert "X-Amzn-SageMaker-Target-Model" in message and "op EagerPyFunc" in message, message
    with ServerProcess(["--multi-model", "--model-root", str(root), "--scan-policy", "warn"]) as proc, \
            proc.client() as http:
        assert http.post("/models", json={"model_name": "pyfunc", "url": str(root / "pyfunc")}).status_code == 200


def test_a_model_from_s3_is_refused_by_default(risky, s3_endpoint, s3_bucket):
    from s3_server import upload_dir

    url = upload_dir(s3_endpoint, s3_bucket, "risky/reads", risky / "reads")
    with ServerProcess([url, "--no-supervisor"]) as proc, proc.client() as http:
        status = http.get("/v1/models/reads").json()["model_version_status"][0]
        assert status["state"] == "END", status
        assert "It arrived through s3://" in status["status"]["error_message"]


# -- signatures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    work = tmp_path_factory.mktemp("keys")
    made = run_cli(["sign", "--new-key", str(work / "team.pem")])
    assert made.returncode == 0, made.stderr.decode()
    assert oct((work / "team.pem").stat().st_mode & 0o777) == "0o600"
    run_cli(["sign", "--new-key", str(work / "other.pem")])
    return work


def signed_bundle(tmp_path: Path, keys: Path) -> Path:
    bundle = tmp_path / "bundle"
    shutil.copytree(HALF_PLUS_TWO, bundle / "half")
    write_code(bundle / "code", "def handler(data, context):\n    return data.read(), 'application/json'\n")
    done = run_cli(["sign", str(bundle), "--key", str(keys / "team.pem")])
    assert done.returncode == 0 and "signed" in done.stdout.decode(), done.stderr.decode()
    return bundle


def test_a_signed_bundle_serves_and_an_altered_byte_or_a_later_version_refuses_the_load(keys, tmp_path):
    bundle = signed_bundle(tmp_path, keys)
    pub = str(keys / "team.pem.pub")
    with ServerProcess([str(bundle / "half"), "--no-supervisor", "--require-signature", pub,
                        "--file-system-poll-wait-seconds", "1"]) as proc, proc.client() as http:
        assert http.post("/v1/models/half:predict", json=INSTANCES).json() == {"predictions": [2.5, 3.0]}
        shutil.copytree(bundle / "half" / "00000123", bundle / "half" / "00000124")  # appears after signing
        deadline = time.monotonic() + 60
        while True:
            status = http.get("/v1/models/half/versions/124").json()
            if "model_version_status" in status and status["model_version_status"][0]["state"] == "END":
                break
            assert time.monotonic() < deadline, (status, proc.output)
            time.sleep(0.5)
        message = status["model_version_status"][0]["status"]["error_message"]
        assert "00000124/saved_model.pb is not in the signed manifest" in message, message
    shutil.rmtree(bundle / "half" / "00000124")

    variables = bundle / "half" / "00000123" / "variables" / "variables.data-00000-of-00001"
    data = bytearray(variables.read_bytes())
    data[0] ^= 1  # one altered byte
    variables.write_bytes(bytes(data))
    with ServerProcess([str(bundle), "--no-supervisor", "--require-signature", pub]) as proc, proc.client() as http:
        status = http.get("/v1/models/half").json()["model_version_status"][0]
        assert status["state"] == "END"
        assert "variables.data-00000-of-00001 differs from what was signed" in status["status"]["error_message"]

    # the wrong key, and no signature at all, fail the start (invoke: every mode reads the same setting)
    other = run_cli(["invoke", str(bundle), "--no-reuse"], input=json.dumps(INSTANCES).encode(),
                    env={"TFSERVO_REQUIRE_SIGNATURE": str(keys / "other.pem.pub")})
    assert other.returncode != 0 and "which is not in" in other.stderr.decode() + other.stdout.decode()
    (bundle / "tfservo-signature.json").unlink()
    unsigned = run_cli(["invoke", str(bundle), "--no-reuse"], input=json.dumps(INSTANCES).encode(),
                       env={"TFSERVO_REQUIRE_SIGNATURE": pub})
    assert unsigned.returncode != 0 and "is not signed" in unsigned.stderr.decode() + unsigned.stdout.decode()


def test_an_altered_handler_refuses_the_bundle_in_a_transform(keys, tmp_path):
    bundle = signed_bundle(tmp_path, keys)
    source = tmp_path / "in"
    source.mkdir()
    (source / "rows.json").write_text(json.dumps(INSTANCES))
    env = {"TFSERVO_REQUIRE_SIGNATURE": str(keys / "team.pem.pub")}
    ok = run_cli(["transform", str(bundle), str(source), str(tmp_path / "out"), "--progress", "none"], env=env)
    assert ok.returncode == 0, ok.stderr.decode()[-2000:]
    with open(bundle / "code" / "inference.py", "a") as f:
        f.write("\nimport os  # added after signing\n")
    bad = run_cli(["transform", str(bundle), str(source), str(tmp_path / "out2"), "--progress", "none"], env=env)
    assert bad.returncode != 0
    assert "code/inference.py differs from what was signed" in bad.stderr.decode(), bad.stderr.decode()[-2000:]


def test_a_signed_archive_loads_through_target_model_and_an_altered_one_does_not(keys, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    archive(root / "good.tar.gz", HALF_PLUS_TWO)
    assert run_cli(["sign", str(root / "good.tar.gz"), "--key", str(keys / "team.pem")]).returncode == 0
    with tarfile.open(root / "good.tar.gz") as tar:
        assert "tfservo-signature.json" in tar.getnames()
    # an archive rebuilt with one byte changed, keeping the old signature member
    work = tmp_path / "x"
    with tarfile.open(root / "good.tar.gz") as tar:
        tar.extractall(work, filter="data")
    pb = work / "00000123" / "saved_model.pb"
    pb.write_bytes(pb.read_bytes() + b"\0")
    with tarfile.open(root / "bad.tar.gz", "w:gz") as tar:
        for item in sorted(work.iterdir()):
            tar.add(item, arcname=item.name)
    archive(root / "unsigned.tar.gz", HALF_PLUS_TWO)
    with ServerProcess(["--multi-model", "--model-root", str(root), "--require-signature",
                        str(keys / "team.pem.pub")]) as proc:
        client = boto3.client("sagemaker-runtime", endpoint_url=proc.url, config=Config(retries={"max_attempts": 1}),
                              **ANY_KEYS)

        def call(target: str) -> dict:
            answer = client.invoke_endpoint(EndpointName="mme", TargetModel=target, Body=b'{"instances": [1.0, 2.0]}',
                                            ContentType="application/json")
            return json.loads(answer["Body"].read())

        assert call("good.tar.gz") == {"predictions": [2.5, 3.0]}
        for target, needle in (("bad.tar.gz", "saved_model.pb differs from what was signed"),
                               ("unsigned.tar.gz", "is not signed")):
            with pytest.raises(ClientError) as refused:
                call(target)
            assert needle in refused.value.response["Error"]["Message"], refused.value.response


def test_sign_says_what_it_needs(keys, tmp_path):
    usage = run_cli(["sign", str(tmp_path)])
    assert usage.returncode == 2 and "--key FILE" in usage.stderr.decode()
    again = run_cli(["sign", "--new-key", str(keys / "team.pem")])
    assert again.returncode == 1 and "exists" in again.stderr.decode()
    (tmp_path / "f.txt").write_text("x")
    wrong = run_cli(["sign", str(tmp_path / "f.txt"), "--key", str(keys / "team.pem")])
    assert wrong.returncode == 1 and "neither a dir nor a tar archive" in wrong.stderr.decode()
    not_a_key = run_cli(["serve", str(HALF_PLUS_TWO), "--require-signature", str(tmp_path / "f.txt")])
    assert not_a_key.returncode != 0 and "holds no PEM public key" in not_a_key.stderr.decode()


def test_a_config_reload_over_grpc_is_refused_as_the_management_api_is(risky):
    import grpc
    from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc

    with ServerProcess([str(HALF_PLUS_TWO), "--no-supervisor"]) as proc:
        request = model_management_pb2.ReloadConfigRequest()
        for name, path in (("half", HALF_PLUS_TWO), ("pyfunc", risky / "pyfunc")):
            config = request.config.model_config_list.config.add()
            config.name, config.base_path, config.model_platform = name, str(path), "tensorflow"
        with grpc.insecure_channel(proc.grpc_target) as channel:
            answer = model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest(request, timeout=120)
        with proc.client() as http:
            deadline = time.monotonic() + 60
            while "model_version_status" not in (status := http.get("/v1/models/pyfunc").json()):
                assert time.monotonic() < deadline, (answer, status)
                time.sleep(0.5)
        said = answer.status.error_message + json.dumps(status)
        assert "op EagerPyFunc" in said and "the management API (HandleReloadConfigRequest)" in said, said
