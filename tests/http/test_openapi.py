"""GET /openapi.json: a valid OpenAPI 3.1 document of every REST route, with request schemas
per served model from its signatures, following models as they load."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from conftest import TFS
from openapi_spec_validator import validate
from server_process import ServerProcess


def test_the_document_is_valid_and_describes_each_model(http):
    doc = http.get("/openapi.json").json()
    validate(doc)
    assert doc["openapi"] == "3.1.0"
    paths = doc["paths"]
    for route in ("/ping", "/invocations", "/endpoints/{EndpointName}/invocations", "/metrics", "/v2", "/v1/models"):
        assert route in paths
    predict = paths["/v1/models/saved_model_half_plus_two_2_versions:predict"]["post"]
    body = predict["requestBody"]["content"]["application/json"]
    # The example validates against the schema, and a request shaped otherwise does not.
    jsonschema.validate(body["example"], body["schema"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"instances": [["not a number"]]}, body["schema"])
    v2 = paths["/v2/models/saved_model_half_plus_two_2_versions/infer"]["post"]["requestBody"]["content"]["application/json"]
    jsonschema.validate(v2["example"], v2["schema"])
    assert v2["schema"]["properties"]["inputs"]["items"]["properties"]["name"]["enum"] == ["x"]
    # the example really is a request the server answers
    got = http.post("/v1/models/saved_model_half_plus_two_2_versions:predict", json=body["example"])
    assert got.status_code == 200, got.text
    got = http.post("/v2/models/saved_model_half_plus_two_2_versions/infer", json=v2["example"])
    assert got.status_code == 200, got.text


def test_the_document_follows_models_as_they_load(tmp_path):
    shutil.copytree(TFS / "saved_model_half_plus_two_cpu", tmp_path / "m")
    server = ServerProcess(["--multi-model", "--model-root", str(tmp_path)]).start()
    try:
        with server.client() as http:
            before = http.get("/openapi.json").json()["paths"]
            assert "/models" in before and not any(p.startswith("/v1/models/late") for p in before)
            assert http.post("/models", json={"model_name": "late", "url": "m"}).status_code == 200
            after = http.get("/openapi.json").json()
            validate(after)
            assert "/v1/models/late:predict" in after["paths"] and "/v2/models/late/infer" in after["paths"]
    finally:
        server.stop()



def test_schemathesis_finds_no_5xx_and_no_answer_off_the_schema(tfs_server, tmp_path):
    """Every operation of the document fuzzed by schemathesis (its CLI: its pytest plugin does not
    run on pytest 9), bounded in examples and time, against the shared server."""
    checks = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("schemathesis")), "run", f"{tfs_server.url}/openapi.json",
         "--checks", checks, "--max-examples", "15", "--generation-deterministic", "--request-timeout", "30",
         "--phases", "examples,coverage,fuzzing", "--warnings", "off", "--no-color"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,  # its cache folder goes there, not in the repo
    )
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    tested = re.search(r"Tested: (\d+)", done.stdout)
    assert tested and int(tested[1]) >= 20, done.stdout[-3000:]  # every route of every served model
