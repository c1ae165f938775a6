"""`tfservo serve --variants FILE` and `--pipeline` on the command line, as a user runs them: a
variants file's mistakes named before TensorFlow loads, version labels per variant, a shadow
whose queue is full dropping copies (counted) while production answers at once, two workers
sharing new weights, and Direct pipelines answering in SageMaker's shapes."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
from conftest import SMC, TFS, write_code
from server_process import ServerProcess, run_observed

HALF_PLUS_THREE = SMC / "resources" / "models" / "half_plus_three" / "00000124"
HALF_PLUS_TWO = TFS / "saved_model_half_plus_two_cpu" / "00000123"


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory) -> Path:
    """Model m: version 1 is half_plus_three (x/2 + 3), version 2 half_plus_two (x/2 + 2)."""
    root = tmp_path_factory.mktemp("labels") / "bundle"
    shutil.copytree(HALF_PLUS_THREE, root / "m" / "1")
    shutil.copytree(HALF_PLUS_TWO, root / "m" / "2")
    return root


def predictions(response) -> list[float]:
    assert response.status_code == 200, response.text
    return json.loads(response.content)["predictions"]


@pytest.mark.parametrize(("text", "message"), [
    ('[[variants]]\nname = "A"\n', "variant A: model is the bundle's path"),
    ('[[variants]]\nname = "a b"\nmodel = "x"\n', "name 'a b' must be 1 to 63 letters"),
    ('[[variants]]\nname = "A"\nmodel = "MISSING"\n', "does not exist"),
    ('[[variants]]\nname = "A"\nmodel = "m"\nweight = 0\n', "every production variant has weight 0"),
    ('[[variants]]\nname = "A"\nmodel = "m"\n[[variants]]\nname = "A"\nmodel = "m"\n', "variant A is declared twice"),
    ('[[variants]]\nname = "A"\nmodels = ["m", "m"]\n', 'need pipeline = "serial"'),
    ('[[variants]]\nname = "A"\nmodel = "m"\ncolour = 1\n', "unknown key 'colour'"),
    ('variants = 3\n', "variants is a list of tables"),
])
def test_a_wrong_variants_file_is_named_before_tensorflow_loads(tmp_path, text, message):
    shutil.copytree(HALF_PLUS_TWO, tmp_path / "m" / "1")
    (tmp_path / "variants.toml").write_text(text)
    _, err, outcome = run_observed(["serve", "--variants", "variants.toml", "--port", "0"], cwd=tmp_path, timeout=120)
    assert outcome["code"] != 0 and not outcome["tensorflow"], err
    assert message in err and "variants.toml" in err, err


def test_each_variant_serves_its_version_label_and_two_workers_share_new_weights(two_versions, tmp_path):
    (tmp_path / "variants.toml").write_text(
        f'[[variants]]\nname = "stable"\nmodel = "{two_versions}"\nversion_label = "stable"\nweight = 1\n\n'
        f'[[variants]]\nname = "canary"\nmodel = "{two_versions}"\nversion_label = "canary"\nweight = 0\n')
    args = ["--variants", str(tmp_path / "variants.toml"), "--version-label", "m:stable=1",
            "--version-label", "m:canary=2", "--workers", "2"]
    body, json_type = b'{"instances": [1.0]}', {"Content-Type": "application/json"}
    with ServerProcess(args) as server, server.client() as http:
        for _ in range(20):  # weight 0: the canary gets nothing unless named
            r = http.post("/endpoints/e/invocations", content=body, headers=json_type)
            assert r.headers["x-amzn-invoked-production-variant"] == "stable" and predictions(r) == [3.5]
        r = http.post("/endpoints/e/invocations", content=body,
                      headers={**json_type, "X-Amzn-SageMaker-Target-Variant": "canary"})
        assert r.headers["x-amzn-invoked-production-variant"] == "canary" and predictions(r) == [2.5]
        # TF Serving's label routes answer as on one bundle
        assert predictions(http.post("/v1/models/m/labels/canary:predict", content=body)) == [2.5]
        changed = http.post("/endpoint/variants/weights", json={"DesiredWeightsAndCapacities": [
            {"VariantName": "stable", "DesiredWeight": 0}, {"VariantName": "canary", "DesiredWeight": 1}]})
        assert changed.status_code == 200, changed.text
        # new connections reach either worker: every one now draws the canary
        for _ in range(20):
            with server.client() as fresh:
                r = fresh.post("/invocations", content=body, headers=json_type)
                assert r.headers["x-amzn-invoked-production-variant"] == "canary" and predictions(r) == [2.5]
        for bad, message in (({"DesiredWeightsAndCapacities": []}, "at least one variant"),
                             ({"DesiredWeightsAndCapacities": [{"VariantName": "stable", "DesiredWeight": -1}]},
                              "at least 0"),
                             ({"DesiredWeightsAndCapacities": [{"VariantName": "canary", "DesiredWeight": 0}]},
                              "keep one above 0")):
            r = http.post("/endpoint/variants/weights", json=bad)
            assert r.status_code == 400 and message in r.json()["error"], r.text


def test_a_full_shadow_queue_drops_copies_and_never_delays_production(tmp_path):
    shutil.copytree(HALF_PLUS_TWO, tmp_path / "prod" / "half_plus_two" / "123")
    shutil.copytree(HALF_PLUS_TWO, tmp_path / "slow" / "half_plus_two" / "123")
    write_code(tmp_path / "slow" / "code", """
        import time

        def handler(data, context):
            time.sleep(3)
            return b"{}", "application/json"
    """)
    (tmp_path / "variants.toml").write_text(
        '[[variants]]\nname = "AllTraffic"\nmodel = "prod"\n[[shadow_variants]]\nname = "S"\nmodel = "slow"\n')
    with ServerProcess(["--variants", str(tmp_path / "variants.toml"), "--shadow-queue", "1", "--workers", "1"]) as server, server.client() as http:
        started = time.monotonic()
        for i in range(12):
            assert predictions(http.post("/invocations", content=json.dumps({"instances": [float(i)]}),
                                         headers={"Content-Type": "application/json"})) == [i / 2 + 2]
        assert time.monotonic() - started < 2.5  # twelve answers while the shadow holds one copy for 3 s
        metrics = http.get("/metrics").text
        dropped = re.search(r'tfservo_shadow_copies_total\{outcome="dropped",variant="S"\} (\d+)', metrics)
        assert dropped and int(dropped[1]) >= 12 - 4 - 1, metrics[-2000:]  # four threads busy, one queued


def test_a_direct_pipeline_runs_the_container_named(tmp_path):
    write_code(tmp_path / "echo" / "code", """
        def handler(data, context):
            return data.read().upper(), "text/plain"
    """)
    shutil.copytree(HALF_PLUS_TWO, tmp_path / "model" / "half_plus_two" / "123")
    with ServerProcess([str(tmp_path / "echo"), str(tmp_path / "model"), "--pipeline", "--pipeline-mode", "direct",
                        "--container-hostnames", "echo,model"]) as server, server.client() as http:
        r = http.post("/invocations", content=b"hi", headers={"X-Amzn-SageMaker-Target-Container-Hostname": "echo"})
        assert r.status_code == 200 and r.content == b"HI"
        r = http.post("/invocations", content=b'{"instances": [2.0]}',
                      headers={"Content-Type": "application/json",
                               "X-Amzn-SageMaker-Target-Container-Hostname": "model"})
        assert predictions(r) == [3.0]
        r = http.post("/endpoints/e/invocations", content=b"hi")
        assert r.status_code == 400 and "TargetContainerHostname" in r.json()["message"]
        assert r.headers["x-amzn-errortype"].startswith("ValidationError")


def test_a_container_of_code_alone_is_refused_outside_a_pipeline(tmp_path):
    write_code(tmp_path / "echo" / "code", "def handler(data, context):\n    return b'', 'text/plain'\n")
    _, err, outcome = run_observed(["serve", str(tmp_path / "echo"), "--port", "0"], cwd=tmp_path, timeout=120)
    assert outcome["code"] != 0 and "no models found" in err, err
