"""SageMaker's /ping and /invocations on a real `tfservo serve`, with the container's own
integration expectations on its half_plus_three model (the default model here) and inputs."""

from __future__ import annotations

import json

import pytest
from conftest import SMC

INPUTS = SMC / "resources" / "inputs"
ATTR = "X-Amzn-SageMaker-Custom-Attributes"


def invoke(http, body, content_type="application/json", **headers):
    return http.post("/invocations", content=body, headers={"Content-Type": content_type, **headers})


def test_ping(http):
    assert http.get("/ping").status_code == 200


def test_execution_parameters(http):
    doc = http.get("/execution-parameters").json()
    assert doc["BatchStrategy"] == "MultiRecord" and doc["MaxPayloadInMB"] == 6
    assert doc["MaxConcurrentTransforms"] >= 1


@pytest.mark.parametrize(
    ("body", "content_type", "expected"),
    [
        (b'{"instances": [1.0, 2.0, 5.0]}', "application/json", [3.5, 4.0, 5.5]),
        (b'{"instances": [[1.0, 2.0, 5.0], [1.0, 2.0, 5.0]]}', "application/json", [[3.5, 4.0, 5.5]] * 2),
        (b"[1.0, 2.0, 5.0]", "application/json", [[3.5, 4.0, 5.5]]),
        (b"[1.0, 2.0, 5.0]\n[1.0, 2.0, 5.0]", "application/json", [[3.5, 4.0, 5.5]] * 2),
        (b"[1.0, 2.0, 5.0]\n[1.0, 2.0, 5.0]", "application/jsonlines", [[3.5, 4.0, 5.5]] * 2),
        (b"[1.0, 2.0, 5.0]\n[1.0, 2.0, 5.0]", "application/jsons", [[3.5, 4.0, 5.5]] * 2),
        (b"1.0", "text/csv", [3.5]),
        (b"0.0,2.0,5.0", "text/csv", [[3.0, 4.0, 5.5]]),
        (b"1.0,2.0,5.0\r\n1.0,2.0,5.0\n", "text/csv", [[3.5, 4.0, 5.5]] * 2),
        (b"1.0,2.0,5.0", "text/csv; charset=utf-8", [[3.5, 4.0, 5.5]]),
        (b'{"instances": [1.0]}', "application/json; charset=utf-8", [3.5]),
    ],
)
def test_content_conversions(http, body, content_type, expected):
    r = invoke(http, body, content_type)
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": expected}


@pytest.mark.parametrize(
    ("name", "content_type", "rows"),
    [
        ("test.json", "application/json", 10),
        ("test.csv", "text/csv", 10),
        ("test-gcloud.jsons", "application/jsonlines", 10),
        ("test-generic.json", "application/json", 1),
        ("test-large.csv", "text/csv", 1),
    ],
)
def test_container_input_files(http, name, content_type, rows):
    r = invoke(http, (INPUTS / name).read_bytes(), content_type)
    assert r.status_code == 200, r.text[:300]
    preds = r.json()["predictions"]
    assert len(preds) == rows
    first = preds[0]
    assert first[:3] == [3.5, 4.0, 5.5]


def test_regress_via_custom_attributes(http):
    body = json.dumps({"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0}, {"x": 2.0}]})
    r = invoke(http, body, **{ATTR: "tfs-method=regress"})
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [3.5, 4.0]}


@pytest.mark.parametrize("version", ["123", "124"])
def test_specific_version(http, version):
    r = invoke(http, b'{"instances": [1.0]}', **{ATTR: f"tfs-model-name=half_plus_three,tfs-model-version={version}"})
    assert r.json() == {"predictions": [3.5]}


def test_other_model_by_name_and_extra_attributes_kept(http):
    r = invoke(
        http,
        b'{"instances": [[1.0]]}',
        **{ATTR: "tfs-model-name=saved_model_half_plus_two_2_versions,tfs-model-version=123,trace=a=b"},
    )
    assert r.json() == {"predictions": [[2.5]]}


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [
        ("application/json", "application/json"),
        ("application/json, application/jsonlines", "application/json"),  # the container's own test
        ("application/json;q=0.9, text/html;q=0.1", "application/json"),
        ("application/jsonlines", "application/jsonlines"),  # the container's test_predict_with_jsonlines
    ],
)
def test_accept_naming_json_gets_the_containers_bytes(http, accept, content_type):
    """The container removes TF Serving's newlines when Accept names JSON; without Accept they stay."""
    r = invoke(http, b'{"instances": [1.0, 2.0, 5.0]}', Accept=accept)
    assert r.headers["content-type"] == content_type
    assert r.content == b'{    "predictions": [3.5, 4.0, 5.5    ]}'
    r = invoke(http, b'{"instances": [1.0, 2.0, 5.0]}')
    assert r.content == b'{\n    "predictions": [3.5, 4.0, 5.5\n    ]\n}'


def test_accept_jsonlines_and_csv(http):
    r = invoke(http, b"1.0,2.0,5.0\n0.0,2.0,5.0", "text/csv", Accept="application/jsonlines")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/jsonlines")
    # the container's bytes: TF Serving's JSON on one line (its test_predict_with_jsonlines)
    assert r.content == b'{    "predictions": [[3.5, 4.0, 5.5], [3.0, 4.0, 5.5]    ]}'
    r = invoke(http, b"1.0,2.0,5.0", "text/csv", Accept="text/plain;q=0.5, text/csv")
    assert r.headers["content-type"].startswith("text/csv")
    assert r.text.strip() == "3.5,4.0,5.5"
    r = invoke(http, b"1.0", "text/csv", Accept="image/png")
    assert r.status_code == 406


@pytest.mark.parametrize(
    ("body", "content_type", "attributes", "status"),
    [
        (b"1.0", "text/csv", "tfs-method=bogus", 400),
        (b"1.0", "text/csv", "tfs-model-version=abc", 400),
        (b"1.0", "text/csv", "tfs-model-name=../etc", 400),
        (b"1.0", "text/csv", "tfs-model-name=nope", 404),
        (b"1.0", "text/csv", "tfs-model-version=999", 404),
        (b"1.0", "image/png", None, 415),
        (b"1.0", "", None, 415),
        (b"whatever", "application/json", None, 400),
        (b'{"junk": "data"}', "application/json", None, 400),
        (b"", "text/csv", None, 400),
        (b"\xff\xfe", "text/csv", None, 400),
        (b'1.0,"unterminated', "text/csv", None, 400),
        (b"a,b\n1.0,2.0", "text/csv", None, 400),
    ],
)
def test_invocation_errors(http, body, content_type, attributes, status):
    headers = {ATTR: attributes} if attributes else {}
    r = invoke(http, body, content_type, **headers)
    assert r.status_code == status, r.text
    assert r.json()["error"]


def test_invocations_body_limit(http):
    r = invoke(http, b"1.0," * 1_200_000 + b"1.0", "text/csv")
    assert r.status_code == 413 and "error" in r.json()


@pytest.mark.parametrize("alias", ["application/x-jsonlines", "application/jsons"])
def test_json_lines_aliases_behave_as_jsonlines(http, alias):
    """Every alias of JSON lines in the media-type registry is read and answered as JSON lines
    on /invocations, as the transform and Beam's content_type= already read it."""
    r = invoke(http, b"[1.0, 2.0, 5.0]\n[1.0, 2.0, 5.0]", alias, Accept=alias)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith(alias)
    assert r.content == b'{    "predictions": [[3.5, 4.0, 5.5], [3.5, 4.0, 5.5]    ]}'  # the container's one line
