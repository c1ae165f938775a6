"""Model management locked down where it matters: on a bind other hosts can reach, with no key
file, the management APIs answer 404 / UNIMPLEMENTED saying how to turn them on, and the
start-up lines say so; SageMaker's multi-model container (SAGEMAKER_MULTI_MODEL=true) keeps
loading models; each management call leaves one audit line and counts in a metric."""

from __future__ import annotations

import logging

import grpc
import httpx
import pytest
import tritonclient.grpc as triton_grpc
from conftest import SMC, tfs_grpc
from server_process import ServerProcess
from tensorflow_serving.apis import model_management_pb2
from tritonclient.utils import InferenceServerException

from tfservo.auth.doors import access_line
from tfservo.auth.keys import add_key
from tfservo.cli.tfs import settings_from_tfs_args
from tfservo.core.settings import ConfigError, resolve_settings

MME = SMC / "resources" / "mme"
MODEL = str(SMC / "resources" / "models" / "half_plus_three")
OFF = "model management is off on this server (listening on 0.0.0.0 without --api-keys)"


def test_a_reachable_server_without_keys_answers_no_management_call():
    with ServerProcess(["--multi-model", "--model-root", str(MME), "--host", "0.0.0.0"]) as server:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for method, path in (("POST", "/models"), ("DELETE", "/models/half_plus_two"),
                                 ("POST", "/v2/repository/models/half_plus_two/load")):
                answer = client.request(method, path, json={"model_name": "half_plus_two", "url": str(MME / "half_plus_two")})
                assert answer.status_code == 404, path
                assert OFF in answer.json()["error"] and "--management on" in answer.json()["error"]
            assert client.get("/models").status_code == 200  # reading stays open
            assert "post" not in client.get("/openapi.json").json()["paths"]["/models"]  # not documented while off
        with triton_grpc.InferenceServerClient(server.grpc_target) as rpc:
            with pytest.raises(InferenceServerException, match="model management is off"):
                rpc.load_model("half_plus_two")
        with tfs_grpc(server.grpc_target) as (_, models):
            with pytest.raises(grpc.RpcError) as caught:
                models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(), timeout=30)
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED and OFF in caught.value.details()
        output = server.output
    assert "WARNING tfservo.audit: access: runtime API open; other doors open" in output
    assert "model management off (listening on 0.0.0.0 without --api-keys; --management on or --api-keys turns it on)" in output
    assert "anyone who reaches this port can invoke and read models" in output
    assert "manage peer=" not in output  # nothing was managed


def test_sagemakers_multi_model_container_keeps_loading_models_and_each_action_is_audited():
    with ServerProcess(["--model-root", str(MME), "--host", "0.0.0.0"], env={"SAGEMAKER_MULTI_MODEL": "true"}) as server:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            loaded = client.post("/models", json={"model_name": "half_plus_two", "url": str(MME / "half_plus_two")})
            assert loaded.status_code == 200, loaded.text
            assert client.post("/models/half_plus_two/invoke", json={"instances": [1.0]}).json() == {"predictions": [2.5]}
            assert client.post("/models", json={"model_name": "nope", "url": "/elsewhere"}).status_code in (400, 403, 404)
            assert client.delete("/models/half_plus_two").status_code == 200
            metrics = client.get("/metrics").text
        output = server.output
    assert "model management on (SageMaker's multi-model container (SAGEMAKER_MULTI_MODEL=true))" in output
    assert "manage peer=127.0.0.1 who=- http POST /models model=half_plus_two outcome=200" in output
    assert "manage peer=127.0.0.1 who=- http DELETE /models/{name} model=half_plus_two outcome=200" in output
    assert "http POST /models model=nope outcome=4" in output
    assert 'tfservo_management_actions_total{door="http",outcome="200"} 2.0' in metrics


def test_when_management_answers(tmp_path):
    keys = str(tmp_path / "keys.json")
    add_key(keys, "ops", ["manage"])

    def management(env=None, **flags):
        return resolve_settings(paths=[MODEL], env=env or {}, **flags).management_open()

    assert management(host="127.0.0.1") == (True, "listening on loopback only")
    assert management(host="::1") == (True, "listening on loopback only")
    assert management(host="0.0.0.0") == (False, "listening on 0.0.0.0 without --api-keys")
    # gRPC on another address counts too
    assert management(host="127.0.0.1", grpc_host="10.1.2.3")[0] is False
    assert management(host="0.0.0.0", api_keys=keys) == (True, "keys with scope manage (--api-keys)")
    assert management(host="0.0.0.0", management="on") == (True, "--management on")
    assert management(host="127.0.0.1", env={"TFSERVO_MANAGEMENT": "off"}) == (False, "--management off")
    with pytest.raises(ConfigError, match="TFSERVO_MANAGEMENT is one of auto, on, off, got 'yes'"):
        management(env={"TFSERVO_MANAGEMENT": "yes"})
    # --multi-model given as a flag is not SageMaker's contract: off on a reachable bind
    flagged = resolve_settings(env={}, multi_model=True, host="0.0.0.0", model_root=str(MME))
    assert flagged.management_open()[0] is False
    # tensorflow_model_server takes the same settings as flags (and environment)
    tfs = settings_from_tfs_args(["--model_base_path=/m", "--management=on", f"--api_keys={keys}"], env={})
    assert (tfs.management, tfs.api_keys, tfs.host) == ("on", keys, "0.0.0.0")
    assert settings_from_tfs_args(["--model_base_path=/m"], env={}).management_open()[0] is False
    level, line = access_line(resolve_settings(paths=[MODEL], env={}, host="0.0.0.0", api_keys=keys))
    assert level == logging.INFO and "model management on (keys with scope manage (--api-keys))" in line
