"""TF Serving's REST API on a real `tfservo serve`, checked against TF Serving's own expectations."""

from __future__ import annotations

import json

import pytest
from conftest import TFS

M = "saved_model_half_plus_two_2_versions"


def post(http, path, doc):
    return http.post(path, content=json.dumps(doc))


def test_predict_row_format(http):
    r = post(http, f"/v1/models/{M}:predict", {"instances": [[1.0], [2.0], [5.0]]})
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [[2.5], [3.0], [4.5]]}
    assert r.headers["content-type"].startswith("application/json")


def test_predict_columnar_format(http):
    r = post(http, f"/v1/models/{M}:predict", {"inputs": [[1.0], [2.0]]})
    assert r.json() == {"outputs": [[2.5], [3.0]]}
    r = post(http, f"/v1/models/{M}:predict", {"inputs": {"x": [[1.0], [2.0]]}})
    assert r.json() == {"outputs": [[2.5], [3.0]]}


def test_predict_named_instances_and_signature_name(http):
    r = post(http, f"/v1/models/{M}:predict", {"signature_name": "serving_default", "instances": [{"x": [1.0]}]})
    assert r.json() == {"predictions": [[2.5]]}


@pytest.mark.parametrize("path", [f"/v1/models/{M}/versions/123:predict", f"/v1/models/{M}/labels/stable:predict"])
def test_predict_by_version_and_label(http, path):
    r = post(http, path, {"instances": [[4.0]]})
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [[4.0]]}


def test_regress_tf_serving_expectation(http):
    r = post(http, f"/v1/models/{M}:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 80}]})
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [42]}


def test_classify_tf_serving_expectation(http):
    r = post(http, f"/v1/models/{M}:classify", {"signature_name": "classify_x_to_y", "examples": [{"x": 20}]})
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [[["", 12]]]}


def test_regress_with_context(http):
    doc = {"signature_name": "regress_x_to_y2", "context": {"x": 4.0}, "examples": [{}, {"x": 10.0}]}
    r = post(http, f"/v1/models/{M}:regress", doc)
    assert r.json() == {"results": [5.0, 8.0]}  # y2 = 0.5x + 3; an example's own x wins


def test_tf1_half_plus_three_and_tf2_model(http):
    r = post(http, "/v1/models/saved_model_half_plus_three:predict", {"instances": [1.0, 2.0, 5.0]})
    assert r.json() == {"predictions": [3.5, 4.0, 5.5]}
    r = post(http, "/v1/models/saved_model_half_plus_two_tf2_cpu:predict", {"instances": [[1.0], [2.0]]})
    assert r.json() == {"predictions": [[2.5], [3.0]]}


@pytest.mark.parametrize("path", [M, f"{M}/versions/123"])
def test_metadata_matches_tf_serving(http, path):
    r = http.get(f"/v1/models/{path}/metadata")
    assert r.status_code == 200, r.text
    expected = json.loads((TFS / "saved_model_half_plus_two_2_versions_metadata.json").read_text())
    got = r.json()
    assert got["metadata"] == expected["metadata"]
    assert got["model_spec"]["name"] == M
    assert got["model_spec"]["version"] == ("123" if "/versions/" in path else "124")


def test_tf2_metadata_matches_tf_serving(http):
    expected = json.loads((TFS / "saved_model_half_plus_two_tf2_2_versions_metadata.json").read_text())
    got = http.get("/v1/models/saved_model_half_plus_two_tf2_cpu/metadata").json()
    assert set(got["metadata"]["signature_def"]["signature_def"]) == set(
        expected["metadata"]["signature_def"]["signature_def"]
    )


def test_status(http):
    r = http.get(f"/v1/models/{M}")
    assert r.json() == {
        "model_version_status": [
            {"version": v, "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
            for v in ("124", "123")
        ]
    }
    assert [s["version"] for s in http.get(f"/v1/models/{M}/labels/canary").json()["model_version_status"]] == ["124"]


def test_b64_string_output(tmp_path_factory):
    """String outputs whose names end in _bytes come back as {"b64": ...}; b64 inputs decode."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from server_process import ServerProcess

    class Echo(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, data):
            return {"out_bytes": data, "length": tf.strings.length(data), "text": data}

    path = tmp_path_factory.mktemp("echo") / "echo" / "1"
    tf.saved_model.save(Echo(), str(path), signatures={"serving_default": Echo().serve.get_concrete_function()})
    with ServerProcess([str(path.parent)]) as server, server.client() as c:
        r = c.post("/v1/models/echo:predict", json={"instances": [{"b64": "AP8="}, "hi"]})
        assert r.status_code == 200, r.text
        preds = r.json()["predictions"]
        assert preds[0]["out_bytes"] == {"b64": "AP8="} and preds[0]["length"] == 2
        assert preds[1] == {"out_bytes": {"b64": "aGk="}, "length": 2, "text": "hi"}
        bad = c.post("/v1/models/echo:predict", json={"instances": [{"b64": "***"}]})
        assert bad.status_code == 400 and "b64" in bad.json()["error"].lower()


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/v1/models/nope:predict", b'{"instances": [1]}', 404),
        ("POST", f"/v1/models/{M}/versions/999:predict", b'{"instances": [[1.0]]}', 404),
        ("POST", f"/v1/models/{M}/labels/nope:predict", b'{"instances": [[1.0]]}', 404),
        ("POST", f"/v1/models/{M}/versions/abc:predict", b'{"instances": [[1.0]]}', 400),
        ("POST", f"/v1/models/{M}:predict", b"", 400),
        ("POST", f"/v1/models/{M}:predict", b"{not json", 400),
        ("POST", f"/v1/models/{M}:predict", b'\xff\xfe{"instances": [1]}', 400),
        ("POST", f"/v1/models/{M}:predict", b"[" * 5000 + b"]" * 5000, 400),
        ("POST", f"/v1/models/{M}:predict", b'{"instances": [[1.0], [2.0, 3.0]]}', 400),
        ("POST", f"/v1/models/{M}:predict", b'{"instances": [["a"]]}', 400),
        ("POST", f"/v1/models/{M}:predict", b'{"instances": [[1.0]], "inputs": [[1.0]]}', 400),
        ("POST", f"/v1/models/{M}:predict", b'{"signature_name": "nope", "instances": [[1.0]]}', 400),
        ("POST", f"/v1/models/{M}:predict", b'{"instances": [{"z": [1.0]}]}', 400),
        ("POST", f"/v1/models/{M}:regress", b'{"examples": [{"x": 1.0}]}', 400),
        ("POST", f"/v1/models/{M}:regress", b'{"signature_name": "regress_x_to_y", "examples": [{"x": {"a": 1}}]}', 400),
        ("POST", f"/v1/models/{M}:explode", b"{}", 404),
        ("GET", f"/v1/models/{M}:predict", b"", 405),
        ("POST", f"/v1/models/{M}/versions/1/metadata", b"{}", 405),  # TF Serving's "Use GET ..."
        ("POST", "/v1/models/a:b:c", b"{}", 404),  # no TF Serving form: "Malformed request"
        ("GET", "/no/such/route", b"", 404),
        ("DELETE", "/ping", b"", 405),
    ],
)
def test_bad_requests_get_json_errors(http, method, path, body, status):
    r = http.request(method, path, content=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]


def test_body_over_limit_is_413(http):
    r = http.post(f"/v1/models/{M}:predict", content=b"[" + b"1.0," * 1_200_000 + b"1.0]")
    assert r.status_code == 413
    assert "--max-request-mb" in r.json()["error"]


def test_server_survives_bad_input(http):
    r = post(http, f"/v1/models/{M}:predict", {"instances": [[1.0]]})
    assert r.status_code == 200
