"""tfservo.ray_serve on a two-node local Ray cluster: the parity table's cases answer with the
bytes `tfservo serve` gives, a replica killed under load is replaced with no lost request
beyond those in flight, and replicas scale up under load and back down."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from clusters import ray_cluster
from conftest import NEGATIVE_QUOTES_HANDLER, SMC, TFS, write_code
from server_process import ServerProcess
from test_parity import CASES, DEFAULT_ENV, answer, by_serve, case_headers

from tfservo.ray_serve import GRPC_SERVICER_FUNCTIONS, ReplicaOptions, build_app

M = "saved_model_half_plus_two_cpu"
# Beyond /invocations: TF Serving's REST API, V2's, errors in each shape.
REQUESTS = [
    ("GET", "/ping", b"", {}),
    ("POST", f"/v1/models/{M}:predict", b'{"instances": [1.0, 2.0, 5.0]}', {}),
    ("POST", f"/v1/models/{M}:regress", b'{"examples": [{"x": 1.0}]}', {}),
    ("GET", f"/v1/models/{M}", b"", {}),
    ("GET", f"/v1/models/{M}/metadata", b"", {}),
    ("POST", f"/v1/models/{M}:predict", b'{"instances": [1.0, }', {}),
    ("POST", "/v1/models/nothing:predict", b'{"instances": [1.0]}', {}),
    ("GET", f"/v2/models/{M}", b"", {}),
    ("POST", f"/v2/models/{M}/infer",
     b'{"inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [1.0, 2.0]}]}', {}),
    ("POST", "/invocations", b"1.0\n2.0\n", {"Content-Type": "text/csv", "Accept": "text/csv"}),
    ("GET", "/nothing", b"", {}),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    with ray_cluster() as address:
        yield address


GRPC_PORT: list[int] = []


@pytest.fixture(scope="module")
def ray_serve(cluster) -> Iterator[str]:
    from ray import serve

    port, grpc_port = _free_port(), _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port},
                grpc_options={"port": grpc_port, "grpc_servicer_functions": GRPC_SERVICER_FUNCTIONS})
    GRPC_PORT[:] = [grpc_port]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()


def deploy(app, name: str = "tfservo") -> None:
    """Replace the app (its replicas stopped first: the two nodes have a CPU each)."""
    from ray import serve

    serve.delete(name)
    serve.run(app, name=name, route_prefix="/")


def replicas(name: str = "tfservo") -> int:
    from ray import serve

    status = serve.status().applications.get(name)
    return 0 if status is None else status.deployments["tfservo"].replica_states.get("RUNNING", 0)


def test_the_parity_cases_answer_as_serve_does(ray_serve, tmp_path):
    handler = tmp_path / "handler" / "half_plus_three"
    shutil.copytree(SMC / "resources" / "models" / "half_plus_three" / "00000124", handler / "00000124")
    write_code(handler / "code", NEGATIVE_QUOTES_HANDLER)
    bundles = {"mme": SMC / "resources" / "mme", "handler": handler}
    for group, bundle in bundles.items():
        cases = [c for c in CASES if c.group == group]
        env = DEFAULT_ENV if group == "mme" else {}
        with ServerProcess([str(bundle)], env=env) as server:
            want = by_serve({group: server}, bundles, cases)
        settings = {"default_model_name": DEFAULT_ENV["SAGEMAKER_TFS_DEFAULT_MODEL_NAME"]} if group == "mme" else {}
        deploy(build_app(str(bundle), settings=settings))
        got = {}
        with httpx.Client(base_url=ray_serve, timeout=60) as client:
            for case in cases:
                r = client.post("/invocations", content=case.body, headers=case_headers(case))
                got[case.id] = answer(r.status_code, r.content)
        assert got == want, group
    # TF Serving's and V2's REST APIs, byte for byte, with the content type; TF Serving's gRPC
    deploy(build_app(str(TFS / M)))
    with ServerProcess([str(TFS / M)]) as server, server.client() as direct, \
            httpx.Client(base_url=ray_serve, timeout=60) as through_ray:
        assert grpc_answers(f"127.0.0.1:{GRPC_PORT[0]}") == grpc_answers(server.grpc_target)
        for method, path, body, headers in REQUESTS:
            a = direct.request(method, path, content=body, headers=headers)
            b = through_ray.request(method, path, content=body, headers=headers)
            if path.endswith("/metadata"):  # signature_def is a protobuf map: its order differs per process
                assert (b.status_code, b.json()) == (a.status_code, a.json())
                continue
            assert (b.status_code, b.headers.get("content-type"), b.content) == \
                   (a.status_code, a.headers.get("content-type"), a.content), (method, path)


def grpc_answers(target: str) -> list[tuple[str, bytes | str]]:
    """TF Serving's stubs: Predict, Regress, GetModelMetadata and two refusals, as (status, bytes)."""
    import grpc
    from tensorflow_serving.apis import (
        get_model_metadata_pb2,
        predict_pb2,
        prediction_service_pb2_grpc,
        regression_pb2,
    )

    from tfservo.codecs.tensor_proto import to_tensor_proto

    predict = predict_pb2.PredictRequest()
    predict.model_spec.name = M
    predict.inputs["x"].CopyFrom(to_tensor_proto(np.array([[1.0], [2.0]], dtype=np.float32)))
    unknown = predict_pb2.PredictRequest()
    unknown.CopyFrom(predict)
    unknown.model_spec.name = "nothing"
    wrong = predict_pb2.PredictRequest()
    wrong.CopyFrom(predict)
    wrong.inputs["y"].CopyFrom(wrong.inputs.pop("x"))
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name = M
    regress.model_spec.signature_name = "regress_x_to_y"
    example = regress.input.example_list.examples.add()
    example.features.feature["x"].float_list.value.append(3.0)
    metadata = get_model_metadata_pb2.GetModelMetadataRequest()
    metadata.model_spec.name = M
    metadata.metadata_field.append("signature_def")
    out: list[tuple[str, bytes | str]] = []
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for call, request in ((stub.Predict, predict), (stub.Predict, unknown), (stub.Predict, wrong),
                              (stub.Regress, regress)):
            try:
                out.append(("OK", call(request, timeout=60).SerializeToString(deterministic=True)))
            except grpc.RpcError as exc:
                out.append((exc.code().name, exc.details()))
        answer = stub.GetModelMetadata(metadata, timeout=60)
        out.append(("OK", answer.model_spec.SerializeToString()))
    return out


def test_a_replica_killed_under_load_is_replaced_losing_only_requests_in_flight(ray_serve):
    import ray

    deploy(build_app(str(TFS / M), options=ReplicaOptions(num_cpus=1, min_replicas=2, max_replicas=2)))
    assert replicas() == 2
    clients, stop = 2, threading.Event()
    outcomes: list[list[int]] = [[] for _ in range(clients)]

    def load(i: int) -> None:
        with httpx.Client(base_url=ray_serve, timeout=60) as client:
            while not stop.is_set():
                try:
                    status = client.post(f"/v1/models/{M}:predict", content=b'{"instances": [1.0]}').status_code
                except httpx.HTTPError:
                    status = 0
                outcomes[i].append(status)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(2)
    names = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("SERVE_REPLICA::")]
    assert len(names) == 2, names
    ray.kill(ray.get_actor(names[0]["name"], namespace=names[0]["namespace"]), no_restart=True)
    # Serve's controller sees the death at its next health check, then starts a replacement.
    deadline = time.monotonic() + 60
    while replicas() == 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    deadline = time.monotonic() + 120
    while replicas() != 2 and time.monotonic() < deadline:
        time.sleep(1)
    before = sum(len(o) for o in outcomes)
    time.sleep(3)  # the replacement serves too
    stop.set()
    for t in threads:
        t.join()
    assert replicas() == 2
    statuses = [s for o in outcomes for s in o]
    failed = [s for s in statuses if s != 200]
    assert len(failed) <= clients, failed  # at most the requests in flight when it died
    assert sum(len(o) for o in outcomes) > before and len(statuses) > 100


def test_replicas_scale_up_under_load_and_back_down(ray_serve, slow_model):
    options = ReplicaOptions(num_cpus=1, min_replicas=1, max_replicas=2, target_ongoing_requests=1,
                             upscale_delay_s=1, downscale_delay_s=3)
    deploy(build_app(str(slow_model), settings={"batching": "off"}, options=options))
    assert replicas() == 1
    stop = threading.Event()
    answered: list[int] = []

    def load() -> None:
        with httpx.Client(base_url=ray_serve, timeout=60) as client:
            while not stop.is_set():
                answered.append(client.post("/v1/models/slow:predict", content=b'{"instances": [1.0]}').status_code)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    deadline, peak = time.monotonic() + 120, 1
    while time.monotonic() < deadline and peak < 2:
        time.sleep(1)
        peak = max(peak, replicas())
    stop.set()
    for t in threads:
        t.join()
    assert peak == 2 and set(answered) == {200}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and replicas() != 1:
        time.sleep(1)
    assert replicas() == 1


def test_serve_run_deploys_the_app_builder_with_its_arguments(cluster, ray_serve):
    """Ray's own command line, as a RayService's import_path runs it: settings as key=value."""
    command = [str(Path(sys.executable).with_name("serve")), "run", "--address", cluster, "--non-blocking",
               "--name", "tfservo", "--route-prefix", "/", "tfservo.ray_serve:app_builder",
               f"bundle={TFS / M}", "batching=off", "num_cpus=1"]
    from ray import serve

    serve.delete("tfservo")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    deadline = time.monotonic() + 120
    while replicas() != 1 and time.monotonic() < deadline:
        time.sleep(1)
    with httpx.Client(base_url=ray_serve, timeout=60) as client:
        r = client.post(f"/v1/models/{M}:predict", content=b'{"instances": [1.0, 2.0]}')
    assert r.json() == {"predictions": [2.5, 3.0]}
    bad = subprocess.run([*command[:-3], "max_replicas=many"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "max_replicas='many' is not a number" in bad.stdout + bad.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

