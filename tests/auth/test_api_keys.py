"""API keys on a real `tfservo serve` (--api-keys): REST with httpx, tritonclient and KServe's
client, gRPC with TF Serving's stubs, tritonclient and KServe's client — no key, a key without the scope, a key limited to another
model, a rotated key — each refused in its protocol's shape; health probes stay open; a
handler's own calls to context.rest_uri still work; audit lines, and no key in any of them."""

from __future__ import annotations

import os
import time

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from conftest import SMC, grpc_predict_request, handler_bundle
from server_process import ServerProcess
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)
from tritonclient.utils import InferenceServerException

from tfservo.auth.keys import add_key

MODEL = SMC / "resources" / "models" / "half_plus_three"
M = "half_plus_three"
BODY = {"instances": [1.0, 2.0]}

# The handler calls the model over REST itself, with no key (as the container's handlers do).
HANDLER = """
    import requests

    def handler(data, context):
        answer = requests.post(context.rest_uri, data=data.read(), timeout=30)
        return answer.text, "application/json"
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    path = str(root / "keys.json")
    keys = {
        "invoker": add_key(path, "invoker", ["invoke"]),
        "reader": add_key(path, "reader", ["read"]),
        "other-model": add_key(path, "other-model", ["invoke", "read"], models=["another_model"]),
        "scraper": add_key(path, "scraper", ["metrics"]),
        "manager": add_key(path, "manager", ["manage"]),
    }
    bundle = handler_bundle(root / "bundle", HANDLER)
    # Every test here sends wrong keys from 127.0.0.1, which no success clears: a limit that the
    # module's failures do not reach (test_throttle.py checks the default's waits).
    with ServerProcess([str(bundle), "--api-keys", path, "--auth-failure-limit", "1000"]) as server:
        yield server, keys, path


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_rest_doors_need_a_key_with_their_scope(served):
    server, keys, _ = served
    with httpx.Client(base_url=server.url, timeout=30) as client:
        bare = client.post("/invocations", json=BODY)
        assert bare.status_code == 401 and bare.headers["www-authenticate"] == 'Bearer realm="tfservo"'
        assert "Authorization: Bearer" in bare.json()["error"]
        assert client.post("/invocations", json=BODY, headers=auth("tfsk_wrong")).status_code == 401
        assert client.post("/invocations", json=BODY, headers=auth(keys["reader"])).status_code == 403
        ok = client.post("/invocations", json=BODY, headers=auth(keys["invoker"]))
        assert ok.status_code == 200 and ok.json() == {"predictions": [3.5, 4.0]}  # through the handler's own call
        limited = client.post(f"/v1/models/{M}:predict", json=BODY, headers=auth(keys["other-model"]))
        assert limited.status_code == 403 and "may not call model 'half_plus_three'" in limited.json()["error"]
        assert client.post(f"/v1/models/{M}:predict", json=BODY, headers=auth(keys["invoker"])).status_code == 200
        assert client.get(f"/v1/models/{M}", headers=auth(keys["invoker"])).status_code == 403  # no read scope
        assert client.get(f"/v1/models/{M}", headers=auth(keys["reader"])).status_code == 200
        assert client.get("/openapi.json").status_code == 401
        assert client.get("/metrics", headers=auth(keys["reader"])).status_code == 403
        scraped = client.get("/metrics", headers=auth(keys["scraper"]))
        assert scraped.status_code == 200 and 'tfservo_auth_refused_total{reason="unauthenticated"}' in scraped.text
        assert client.get("/ping").status_code == 200 and client.get("/v2/health/ready").status_code == 200
        for hostile in ("Bearer " + "x" * 8000, "Basic Zm9vOmJhcg==", "Bearer", "Bearer \u00e9\u00e9".encode()):
            answer = client.post("/invocations", json=BODY, headers={"Authorization": hostile})
            assert answer.status_code == 401, hostile[:20]
        # past the header line limit the protocol answers before the key check
        assert client.post("/invocations", json=BODY, headers={"Authorization": "Bearer " + "x" * 20000}).status_code == 431


def test_tritonclient_passes_the_header_over_rest_and_grpc(served):
    server, keys, _ = served
    x = np.array([1.0, 2.0], np.float32)
    rest = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    tensor = triton_http.InferInput("x", [2], "FP32")
    tensor.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException):
        rest.infer(M, [tensor])
    answer = rest.infer(M, [tensor], headers=auth(keys["invoker"]))
    assert answer.as_numpy("y").tolist() == [3.5, 4.0]
    with triton_grpc.InferenceServerClient(server.grpc_target) as client:
        tensor = triton_grpc.InferInput("x", [2], "FP32")
        tensor.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED|API key"):
            client.infer(M, [tensor])
        bearer = {"authorization": f"Bearer {keys['invoker']}"}  # gRPC metadata keys are lower case
        assert client.infer(M, [tensor], headers=bearer).as_numpy("y").tolist() == [3.5, 4.0]
        assert client.is_server_live()  # open for probes


# In its own process: kserve's generated V2 protos and tritonclient's clash in one interpreter.
KSERVE_CLIENT = """
import asyncio, json, sys
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

url, grpc_target, model, key = sys.argv[1:5]

def request():
    tensor = InferInput("x", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1.0, 2.0], np.float32), binary_data=False)
    return InferRequest(model, [tensor])

async def main():
    out = {}
    rest = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=60))
    try:
        try:
            await rest.infer(url, request(), model_name=model)
            out["rest-bare"] = "answered"
        except Exception as exc:
            out["rest-bare"] = str(exc)
        answer = await rest.infer(url, request(), model_name=model, headers={"Authorization": f"Bearer {key}"})
        out["rest"] = answer.outputs[0].data
    finally:
        await rest.close()
    client = InferenceGRPCClient(grpc_target, retries=0, timeout=60)
    try:
        try:
            await client.infer(request())
            out["grpc-bare"] = "answered"
        except Exception as exc:
            out["grpc-bare"] = str(exc)
        answer = await client.infer(request(), headers=[("authorization", f"Bearer {key}")])
        out["grpc"] = [float(v) for v in answer.outputs[0].as_numpy().tolist()]
    finally:
        await client.close()
    print(json.dumps(out))

asyncio.run(main())
"""


def test_the_kserve_client_passes_the_header_over_rest_and_grpc(served):
    import json
    import subprocess
    import sys

    server, keys, _ = served
    done = subprocess.run([sys.executable, "-c", KSERVE_CLIENT, server.url, server.grpc_target, M, keys["invoker"]],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert "401" in got["rest-bare"] and "UNAUTHENTICATED" in got["grpc-bare"]
    assert got["rest"] == got["grpc"] == [3.5, 4.0]


def test_tf_serving_stubs_pass_the_key_as_metadata(served):
    server, keys, _ = served
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = grpc_predict_request(M, np.array([1.0, 2.0], np.float32))
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(request, timeout=30)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answer = stub.Predict(request, timeout=30, metadata=[("authorization", f"Bearer {keys['invoker']}")])
        assert list(answer.outputs["y"].float_val) == [3.5, 4.0]
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(request, timeout=30, metadata=[("authorization", f"Bearer {keys['other-model']}")])
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        metadata.model_spec.name = M
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetModelMetadata(metadata, timeout=30, metadata=[("authorization", f"Bearer {keys['invoker']}")])
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED  # metadata needs the read scope
        stub.GetModelMetadata(metadata, timeout=30, metadata=[("authorization", f"Bearer {keys['reader']}")])


def test_management_needs_the_manage_scope_and_names_the_key_in_its_audit_line(served):
    server, keys, _ = served
    config = model_management_pb2.ReloadConfigRequest()
    entry = config.config.model_config_list.config.add()
    entry.name, entry.base_path = M, str(MODEL)  # a served name: refused, so the server is unchanged
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.HandleReloadConfigRequest(config, timeout=30, metadata=[("authorization", f"Bearer {keys['invoker']}")])
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as caught:
            stub.HandleReloadConfigRequest(config, timeout=30, metadata=[("authorization", f"Bearer {keys['manager']}")])
        assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with httpx.Client(base_url=server.url, timeout=30) as client:
        answer = client.post(f"/v2/repository/models/{M}/load", headers=auth(keys["manager"]))
        assert answer.status_code == 400  # one bundle served: no repository to load from
    output = server.wait_for("http POST /v2/repository/models/")
    assert ("manage peer=127.0.0.1 who=manager grpc /tensorflow.serving.ModelService/HandleReloadConfigRequest "
            f"model={M} outcome=ALREADY_EXISTS") in output
    assert f"manage peer=127.0.0.1 who=manager http POST /v2/repository/models/{{name}}/load model={M} outcome=400" in output
    assert "who=invoker grpc" not in output  # refused before the method: a refusal line instead


def test_a_rotated_key_is_refused_and_its_successor_taken_without_a_restart(served):
    server, keys, path = served
    new = add_key(path, "invoker-2", ["invoke"])
    os.utime(path, (time.time() + 5, time.time() + 5))
    with httpx.Client(base_url=server.url, timeout=30) as client:
        deadline = time.monotonic() + 10
        while client.post(f"/v1/models/{M}:predict", json=BODY, headers=auth(new)).status_code != 200:
            assert time.monotonic() < deadline, "the new key was never taken"
            time.sleep(0.3)
    output = server.output
    assert "refused unauthenticated" in output and "refused forbidden" in output and "key=other-model" in output
    for key in [*keys.values(), new]:
        assert key not in output


def test_keys_on_lock_the_runtime_api_too(served):
    """--api-keys alone: SageMaker's runtime API takes a bearer key with scope invoke; boto3
    without one (it signs with SigV4, which this server was not given keys for) gets AWS's
    exception, and a key without the scope AccessDeniedException."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    server, keys, _ = served
    url = server.url + "/endpoints/ep/invocations"
    bare = httpx.post(url, json=BODY)
    assert bare.status_code == 403 and bare.headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"
    assert httpx.post(url, json=BODY, headers=auth("tfsk_wrong")).headers["x-amzn-ErrorType"] == "UnrecognizedClientException"
    assert httpx.post(url, json=BODY, headers=auth(keys["reader"])).headers["x-amzn-ErrorType"] == "AccessDeniedException"
    keyed = httpx.post(url, json=BODY, headers=auth(keys["invoker"]))
    assert keyed.status_code == 200, keyed.text
    client = boto3.client("sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
                          aws_access_key_id="AKIDANYONE0000000000", aws_secret_access_key="anything",
                          config=Config(retries={"max_attempts": 1}))
    with pytest.raises(ClientError) as caught:
        client.invoke_endpoint(EndpointName="ep", Body=b'{"instances": [1.0]}', ContentType="application/json")
    assert caught.value.response["Error"]["Code"] == "MissingAuthenticationTokenException"
    assert "access: runtime API API keys with scope invoke;" in server.output


def test_the_runtime_api_is_open_under_keys_only_when_asked(tmp_path):
    path = str(tmp_path / "keys.json")
    add_key(path, "invoker", ["invoke"])
    with ServerProcess([str(MODEL), "--api-keys", path, "--open-runtime-api"]) as server:
        answer = httpx.post(server.url + "/endpoints/ep/invocations", json=BODY)
        assert answer.status_code == 200, answer.text
        assert httpx.post(server.url + "/invocations", json=BODY).status_code == 401  # only the runtime API
        assert "access: runtime API open;" in server.output


GRPC_URI_HANDLER = """
    import json

    import grpc
    import requests
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    def handler(data, context):
        # The source docs' second example: a channel of the handler's own, from context.grpc_uri.
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "half_plus_three"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto([1.0], dtype=tf.float32, shape=[1]))
        with grpc.insecure_channel(context.grpc_uri) as channel:
            response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
        rest = requests.post(context.rest_uri, json={"instances": [1.0]}, timeout=30).json()
        return json.dumps({"grpc": list(response.outputs["y"].float_val), "rest": rest["predictions"],
                           "grpc_uri": context.grpc_uri, "rest_uri": context.rest_uri,
                           "grpc_port": context.grpc_port}), "application/json"
"""


def test_handlers_reach_their_server_under_keys_and_no_one_else_does(tmp_path):
    """Under --api-keys a handler's context.grpc_uri and rest_uri answer (every request, for the
    worker's life); the door they lead to answers only them: REST without its secret prefix is
    404, gRPC is on a Unix socket only this user can reach, and neither manages models."""
    import urllib.parse

    from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc

    path = str(tmp_path / "keys.json")
    invoker = add_key(path, "invoker", ["invoke"])
    bundle = handler_bundle(tmp_path / "bundle", GRPC_URI_HANDLER)
    with ServerProcess([str(bundle), "--api-keys", path, "--workers", "2"]) as server:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            answers = [client.post("/invocations", json=BODY, headers=auth(invoker)) for _ in range(6)]
        assert [a.status_code for a in answers] == [200] * 6, answers[-1].text
        body = answers[0].json()
        assert body["grpc"] == [3.5] and body["rest"] == [3.5] and body["grpc_port"] is None
        assert body["grpc_uri"].startswith("unix:")
        socket_path = body["grpc_uri"].removeprefix("unix:")
        assert oct(os.stat(os.path.dirname(socket_path)).st_mode & 0o777) == "0o700"

        rest = urllib.parse.urlsplit(body["rest_uri"])
        bare = httpx.get(f"http://{rest.netloc}/v1/models/{M}")
        assert bare.status_code == 404 and "only this server's own handlers" in bare.json()["error"]
        prefix = rest.path.split("/v1/")[0]
        load = httpx.post(f"http://{rest.netloc}{prefix}/v2/repository/models/intruder/load", json={})
        assert load.status_code == 404 and "model management is off" in load.json()["error"], load.text

        with grpc.insecure_channel(body["grpc_uri"]) as channel:
            request = model_management_pb2.ReloadConfigRequest()
            model = request.config.model_config_list.config.add()
            model.name, model.base_path, model.model_platform = "intruder", str(bundle / M), "tensorflow"
            with pytest.raises(grpc.RpcError) as caught:
                model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest(request, timeout=30)
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED and "management is off" in caught.value.details()
        assert httpx.get(server.url + "/v1/models/intruder", headers=auth(invoker)).status_code in (403, 404)
        assert "model=intruder outcome=OK" not in server.output
