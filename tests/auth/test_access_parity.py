"""Auth on every door says the same: TF Serving REST, V2 REST, TF Serving gRPC and V2 gRPC refuse
a missing key, an unknown key, a key without the scope and a key limited to other models with
the same message, in their protocol's status (401/UNAUTHENTICATED, 403/PERMISSION_DENIED), and
one audit line each that names the same reason, key, scope and model (auth/access.py decides)."""

from __future__ import annotations

import re
import time

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from conftest import SMC, grpc_predict_request
from server_process import ServerProcess
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tfservo.auth.keys import add_key

MODEL = SMC / "resources" / "models" / "half_plus_three"
M = "half_plus_three"
AUDIT = re.compile(r"refused (\w+) peer=\S+ key=(\S+) (?:POST \S+|grpc \S+) scope=(\w+) model=(\S+): (.*)")


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    keys = str(tmp_path_factory.mktemp("parity-keys") / "keys.json")
    tokens = {
        "reader": add_key(keys, "reader", ["read"]),
        "limited": add_key(keys, "limited", ["invoke"], models=["another_model"]),
    }
    with ServerProcess([str(MODEL), "--api-keys", keys]) as server:
        yield server, tokens


def _rest(server, token: str | None, v2: bool) -> tuple[str, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=server.url) as client:
        if v2:
            r = client.post(f"/v2/models/{M}/infer", headers=headers, json={
                "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
        else:
            r = client.post(f"/v1/models/{M}:predict", headers=headers, json={"instances": [1.0]})
    kind = {401: "unauthenticated", 403: "forbidden"}.get(r.status_code, str(r.status_code))
    return kind, r.json()["error"]


def _tfs_grpc(server, token: str | None) -> tuple[str, str]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        try:
            stub.Predict(grpc_predict_request(M, np.array([1.0], np.float32)), timeout=30,
                         metadata=[("authorization", f"Bearer {token}")] if token else [])
        except grpc.RpcError as exc:
            return _grpc_kind(exc.code()), exc.details()
    return "ok", ""


def _v2_grpc(server, token: str | None) -> tuple[str, str]:
    client = triton.InferenceServerClient(server.grpc_target)
    x = triton.InferInput("x", [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], np.float32))
    try:
        client.infer(M, [x], headers={"authorization": f"Bearer {token}"} if token else None)
    except InferenceServerException as exc:
        status = exc.status() or ""
        return _grpc_kind(getattr(grpc.StatusCode, status.removeprefix("StatusCode."), None)), exc.message()
    finally:
        client.close()
    return "ok", ""


def _grpc_kind(code: grpc.StatusCode | None) -> str:
    return {grpc.StatusCode.UNAUTHENTICATED: "unauthenticated", grpc.StatusCode.PERMISSION_DENIED: "forbidden"}.get(
        code, str(code))


DOORS = {
    "tfs rest": lambda server, token: _rest(server, token, v2=False),
    "v2 rest": lambda server, token: _rest(server, token, v2=True),
    "tfs grpc": _tfs_grpc,
    "v2 grpc": _v2_grpc,
}


@pytest.mark.parametrize("case", ["no key", "unknown key", "no invoke scope", "another model only"])
def test_every_door_refuses_alike_with_one_audit_line_each(keyed, case) -> None:
    server, tokens = keyed
    token = {"no key": None, "unknown key": "tfsk_not_a_key", "no invoke scope": tokens["reader"],
             "another model only": tokens["limited"]}[case]
    before = len(AUDIT.findall(server.output))
    answers = {door: ask(server, token) for door, ask in DOORS.items()}
    assert len(set(answers.values())) == 1, answers  # the same kind and message on every door
    kind, message = answers["tfs rest"]
    assert kind == ("unauthenticated" if case in ("no key", "unknown key") else "forbidden")
    expected = {
        "no key": "this server needs an API key",
        "unknown key": "the API key is not valid",
        "no invoke scope": "API key 'reader' lacks the 'invoke' scope",
        "another model only": f"API key 'limited' may not call model '{M}'",
    }[case]
    assert expected in message
    deadline = time.monotonic() + 10  # the server's log reaches us a moment after its answer
    while len(lines := AUDIT.findall(server.output)[before:]) < len(DOORS) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(lines) == len(DOORS), lines  # one each
    assert len({(reason, key, scope, model, why) for reason, key, scope, model, why in lines}) == 1, lines
    reason, key, scope, model, why = lines[0]
    assert (reason, scope, why) == (kind, "invoke", message)
    assert key == {"no invoke scope": "reader", "another model only": "limited"}.get(case, "-")
    assert model == (M if case == "another model only" else "-")
