"""Model status of versions that failed to load, over REST and gRPC, as TF Serving reports them.

TF Serving's GetModelStatus reports every version it has seen: a failed one is END with its
load error's own code and message; only a version it never saw is NOT_FOUND.
"""

from __future__ import annotations

import shutil

import grpc
import pytest
import tensorflow as tf
from conftest import TFS, tfs_grpc
from google.protobuf import json_format
from server_process import ServerProcess
from tensorflow_serving.apis import get_model_status_pb2, predict_pb2, prediction_log_pb2

M = "half_plus_two"
GOOD, CORRUPT, BAD_WARMUP = 1, 2, 3
Status = get_model_status_pb2.ModelVersionStatus


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """Version 1 loads; version 2's saved_model.pb is cut short; version 3's warmup request is wrong."""
    root = tmp_path_factory.mktemp("status") / M
    source = TFS / "saved_model_half_plus_two_2_versions" / "00000123"
    for version in (GOOD, CORRUPT, BAD_WARMUP):
        shutil.copytree(source, root / str(version))
    pb = root / str(CORRUPT) / "saved_model.pb"
    pb.write_bytes(pb.read_bytes()[: pb.stat().st_size // 2])
    request = predict_pb2.PredictRequest()
    request.inputs["no_such_input"].CopyFrom(tf.make_tensor_proto([[1.0]], dtype=tf.float32))
    warmup = root / str(BAD_WARMUP) / "assets.extra" / "tf_serving_warmup_requests"
    warmup.parent.mkdir()
    with tf.io.TFRecordWriter(str(warmup)) as writer:
        writer.write(prediction_log_pb2.PredictionLog(predict_log={"request": request}).SerializeToString())
    return root


@pytest.fixture(scope="module")
def clients(model_dir):
    """An HTTP client and TF Serving's ModelService stub, on one `tfservo serve` of model_dir."""
    with ServerProcess([str(model_dir)]) as proc, proc.client() as http, tfs_grpc(proc.grpc_target) as stubs:
        yield http, stubs[1]


def grpc_status(models, name: str, version: int | None = None) -> get_model_status_pb2.GetModelStatusResponse:
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    return models.GetModelStatus(request, timeout=30)


def as_json(response) -> dict:
    return json_format.MessageToDict(
        response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def test_every_version_is_reported_with_its_own_error(clients, model_dir):
    http, _ = clients
    r = http.get(f"/v1/models/{M}")
    assert r.status_code == 200, r.text
    entries = r.json()["model_version_status"]
    assert [(e["version"], e["state"], e["status"]["error_code"]) for e in entries] == [
        ("3", "END", "INVALID_ARGUMENT"),  # the warmup request's own error code
        ("2", "END", "DATA_LOSS"),  # TF's code for a SavedModel file that does not parse
        ("1", "AVAILABLE", "OK"),
    ]
    corrupt, bad_warmup, good = entries[1]["status"], entries[0]["status"], entries[2]["status"]
    assert str(model_dir / "2") in corrupt["error_message"] and "Cannot parse" in corrupt["error_message"]
    assert "tf_serving_warmup_requests" in bad_warmup["error_message"]
    assert "record 1" in bad_warmup["error_message"]
    assert good["error_message"] == ""


def test_failed_version_status_is_reported_not_404(clients, model_dir):
    http, _ = clients
    r = http.get(f"/v1/models/{M}/versions/{CORRUPT}")
    assert r.status_code == 200, r.text
    (entry,) = r.json()["model_version_status"]
    assert (entry["version"], entry["state"], entry["status"]["error_code"]) == ("2", "END", "DATA_LOSS")
    assert str(model_dir / "2") in entry["status"]["error_message"]
    r = http.get(f"/v1/models/{M}/versions/{GOOD}")
    ok = {"error_code": "OK", "error_message": ""}
    assert r.json() == {"model_version_status": [{"version": "1", "state": "AVAILABLE", "status": ok}]}


def test_versions_never_seen_are_not_found(clients):
    http, _ = clients
    r = http.get(f"/v1/models/{M}/versions/7")
    assert r.status_code == 404
    assert r.json()["error"].startswith(f"Could not find version 7 of model {M}")
    r = http.get("/v1/models/nope")
    assert r.status_code == 404
    assert r.json()["error"].startswith("Could not find any versions of model nope")


def test_failed_versions_still_do_not_serve(clients):
    http, _ = clients
    r = http.post(f"/v1/models/{M}/versions/{CORRUPT}:predict", json={"instances": [1.0]})
    assert r.status_code == 404
    r = http.post(f"/v1/models/{M}:predict", json={"instances": [1.0]})
    assert r.json() == {"predictions": [2.5]}  # the latest AVAILABLE version answers


def test_ping_is_200_while_one_version_serves(clients):
    http, _ = clients
    assert http.get("/ping").status_code == 200


def test_grpc_status_matches_rest(clients):
    http, models = clients
    assert as_json(grpc_status(models, M)) == http.get(f"/v1/models/{M}").json()
    for version in (GOOD, CORRUPT, BAD_WARMUP):
        response = grpc_status(models, M, version)
        assert as_json(response) == http.get(f"/v1/models/{M}/versions/{version}").json()
    (entry,) = grpc_status(models, M, CORRUPT).model_version_status
    data_loss = grpc.StatusCode.DATA_LOSS.value[0]
    assert (entry.version, entry.state, entry.status.error_code) == (CORRUPT, Status.END, data_loss)


def test_grpc_unknown_version_and_model_are_not_found(clients):
    _, models = clients
    with pytest.raises(grpc.RpcError) as err:
        grpc_status(models, M, 7)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert err.value.details().startswith(f"Could not find version 7 of model {M}")
    with pytest.raises(grpc.RpcError) as err:
        grpc_status(models, "nope")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in err.value.details()
