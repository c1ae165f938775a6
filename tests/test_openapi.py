"""GET /openapi.json: a valid OpenAPI 3.1 document of every REST route, with request schemas
per served model from its signatures, following models as they load."""

from __future__ import annotations

import shutil

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
