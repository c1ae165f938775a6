"""Drop-in for TF Serving deployments: `tensorflow_model_server` with KServe's and TF Serving's
Docker argument lists, TF Serving's clients (REST, gRPC stubs, grpc.health.v1), its metric
names, time limits (504, DEADLINE_EXCEEDED, rows dropped from a batch) and TLS."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from certificates import certificates
from conftest import TFS, grpc_predict_request, tfs_grpc, write_code
from server_process import ServerProcess
from tensorflow_serving.apis import model_management_pb2

from tfservo.cli.tfs import parse_tfs_args, settings_from_tfs_args
from tfservo.core.settings import ConfigError

HALF_PLUS_TWO = TFS / "saved_model_half_plus_two_cpu"
TFMS = str(Path(sys.executable).with_name("tensorflow_model_server"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TFServingProcess(ServerProcess):
    """`tensorflow_model_server ARGS` (ServerProcess reads the same start-up log lines)."""

    def __init__(self, args, env=None):
        super().__init__([], env=env)
        self.args = [TFMS, *args]


# -- the command line ---------------------------------------------------------------------------

KSERVE_ARGS = [  # kserve-tensorflow-serving ServingRuntime, {{.Name}} filled in
    "--model_name=half_plus_two", "--port=9000", "--rest_api_port=8080", "--model_base_path=/mnt/models",
    "--rest_api_timeout_in_ms=60000",
]


def test_kserve_and_tf_serving_docker_argument_lists_mean_what_they_mean_there(tmp_path):
    settings = settings_from_tfs_args(KSERVE_ARGS, env={})
    assert (settings.port, settings.grpc_port, settings.host) == (8080, 9000, "0.0.0.0")
    assert settings.request_timeout == 60.0 and settings.paths == ()
    assert (settings.model_name, settings.model_base_path, settings.model_config_file) == ("half_plus_two", "/mnt/models", None)
    # TF Serving's image: MODEL_NAME and MODEL_BASE_PATH
    settings = settings_from_tfs_args(["--port=8500", "--rest_api_port=8501"], env={"MODEL_NAME": "m", "MODEL_BASE_PATH": "/models"})
    assert (settings.model_name, settings.model_base_path) == ("m", "/models/m")
    assert settings.file_system_poll_wait_seconds == 1.0  # TF Serving's default
    given, ignored = parse_tfs_args(["--enable_batching", "--noenable_model_warmup", "--grpc_max_threads", "4",
                                     "--rest_api_num_threads=8"])
    assert given == {"enable_batching": True, "enable_model_warmup": False, "grpc_max_threads": 4,
                     "rest_api_num_threads": 8}
    assert ignored == ["grpc_max_threads", "rest_api_num_threads"]
    with pytest.raises(ConfigError, match="unknown flag --rest_api_prot; did you mean --rest_api_port"):
        parse_tfs_args(["--rest_api_prot=8501"])
    with pytest.raises(ConfigError, match="needs int value"):
        parse_tfs_args(["--port=eighty"])
    with pytest.raises(ConfigError, match="nothing to serve"):
        settings_from_tfs_args(["--port=1"], env={})


def test_a_bad_model_config_file_is_reported_in_tf_servings_words(tmp_path):
    bad = tmp_path / "models.config"
    bad.write_text('model_config_list { config { name: "m" base_pth: "/models/m" } }\n')
    done = subprocess.run([TFMS, f"--model_config_file={bad}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    # what TF Serving's own test looks for, then which file and what was wrong
    assert "Error parsing text-format tensorflow.serving.ModelServerConfig" in done.stderr
    assert str(bad) in done.stderr and "base_pth" in done.stderr


def test_a_misspelt_flag_stops_start_up_naming_it():
    done = subprocess.run([TFMS, "--model_base_path=/x", "--enable_batchin"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown flag --enable_batchin; did you mean --enable_batching?" in done.stderr


@pytest.fixture(scope="module")
def tfs(tmp_path_factory):
    """tensorflow_model_server as KServe runs it, with a monitoring config (and a config to poll)."""
    work = tmp_path_factory.mktemp("tfms")
    monitoring = work / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true, path: "/monitoring/prometheus/metrics" }\n')
    rest, grpc_port = free_port(), free_port()
    server_tmp = work / "tmp"
    server_tmp.mkdir()
    args = [a for a in KSERVE_ARGS if not a.startswith(("--port", "--rest_api_port", "--model_base_path"))]
    server = TFServingProcess(
        [*args, f"--port={grpc_port}", f"--rest_api_port={rest}", f"--model_base_path={HALF_PLUS_TWO}",
         f"--monitoring_config_file={monitoring}", "--grpc_max_threads=8", f"--grpc_socket_path={work / 'grpc.sock'}"],
        env={"TMPDIR": str(server_tmp)},
    ).start()
    server.tmp = server_tmp
    server.grpc_socket = f"unix:{work / 'grpc.sock'}"
    server.grpc_target = f"127.0.0.1:{grpc_port}"
    yield server
    server.stop()


def test_tf_serving_clients_talk_to_it(tfs):
    assert "0.0.0.0" in tfs.output  # all interfaces, like TF Serving
    assert list(tfs.tmp.iterdir()) == []  # --model_base_path leaves no generated config behind
    assert "--grpc_max_threads is accepted for compatibility and has no effect" in tfs.output
    with tfs.client() as http:
        got = http.post("/v1/models/half_plus_two:predict", json={"instances": [1.0, 2.0]})
        assert got.json() == {"predictions": [2.5, 3.0]}
        listing = http.get("/v1/models").json()
        assert listing["models"][0]["name"] == "half_plus_two"
        assert listing["models"][0]["model_version_status"][0]["state"] == "AVAILABLE"
    with tfs_grpc(tfs.grpc_target) as (predict, models):
        answer = predict.Predict(grpc_predict_request("half_plus_two", np.array([4.0], np.float32)), timeout=30)
        assert list(answer.outputs["y"].float_val) == [4.0]
        # on every interface with no --api_keys, TF Serving's reload is off until --management=on
        with pytest.raises(grpc.RpcError) as caught:
            models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(), timeout=30)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED and "--management on" in caught.value.details()


def test_grpc_on_a_unix_socket_answers_every_service(tfs):
    """--grpc_socket_path: TF Serving's stubs, V2 (tritonclient) and health over unix:, beside TCP."""
    import tritonclient.grpc as grpcclient
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    assert f"and {tfs.grpc_socket}" in tfs.output
    with tfs_grpc(tfs.grpc_socket) as (predict, models):
        answer = predict.Predict(grpc_predict_request("half_plus_two", np.array([4.0], np.float32)), timeout=30)
        assert list(answer.outputs["y"].float_val) == [4.0]
        with pytest.raises(grpc.RpcError) as missing:
            predict.Predict(grpc_predict_request("nope", np.array([4.0], np.float32)), timeout=30)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    with grpc.insecure_channel(tfs.grpc_socket) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="half_plus_two"), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    triton = grpcclient.InferenceServerClient(tfs.grpc_socket)
    try:
        x = grpcclient.InferInput("x", [2], "FP32")
        x.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
        assert triton.infer("half_plus_two", [x]).as_numpy("y").tolist() == [2.5, 3.0]
    finally:
        triton.close()


def test_a_profile_is_captured_over_the_grpc_port(tfs, tmp_path):
    """TensorFlow's own profiler client (what TensorBoard's Capture Profile calls) against the
    serving port, while requests run: TensorFlow's trace lands in the logdir."""
    import tensorflow as tf

    stop = threading.Event()

    def load():
        with tfs.client() as http:
            while not stop.is_set():
                http.post("/v1/models/half_plus_two:predict", json={"instances": [1.0]})

    loader = threading.Thread(target=load)
    loader.start()
    try:
        tf.profiler.experimental.client.trace(f"grpc://{tfs.grpc_target}", str(tmp_path / "logs"), 1000)
    finally:
        stop.set()
        loader.join(30)
    traces = list((tmp_path / "logs" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and b"tfservo.run" in traces[0].read_bytes()  # each model run is annotated


def test_grpc_health_probes(tfs):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(tfs.grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == serving
        assert health.Check(health_pb2.HealthCheckRequest(service="half_plus_two"), timeout=10).status == serving
        with pytest.raises(grpc.RpcError) as caught:
            health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_tf_serving_metric_names_appear_and_move(tfs):
    def count(text: str, line_start: str) -> float:
        for line in text.splitlines():
            if line.startswith(line_start):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    ok = ':tensorflow:serving:request_count{model_name="half_plus_two",status="OK"}'
    with tfs.client() as http:
        before = http.get("/monitoring/prometheus/metrics").text
        for _ in range(3):
            http.post("/v1/models/half_plus_two:predict", json={"instances": [1.0]})
        http.post("/v1/models/half_plus_two:predict", json={"instances": "bad"})
        after = http.get("/monitoring/prometheus/metrics").text
        assert http.get("/metrics").status_code == 200  # tfservo's own stay
    assert count(after, ok) == count(before, ok) + 3
    assert count(after, ':tensorflow:serving:request_count{model_name="half_plus_two",status="INVALID_ARGUMENT"}') >= 1
    assert "# TYPE :tensorflow:serving:request_latency histogram" in after
    assert ':tensorflow:serving:request_latency_bucket{API="predict",entrypoint="REST",model_name="half_plus_two",le="10"}' in after
    assert count(after, ':tensorflow:serving:runtime_latency_count{API="predict",model_name="half_plus_two",runtime="TF1"}') >= 3
    assert count(after, ":tensorflow:core:graph_runs") > count(before, ":tensorflow:core:graph_runs")
    assert ":tensorflow:cc:saved_model:load_attempt_count{" in after and 'status="success"} 1' in after


def test_its_lone_worker_killed_is_replaced_and_both_ports_answer_again(tfs):
    """Last of the tests on this server: its worker killed as the OOM killer would."""
    worker = int(re.search(r"pid (\d+) of 1 workers", tfs.output)[1])
    os.kill(worker, signal.SIGKILL)
    with httpx.Client(base_url=tfs.url, timeout=120, headers={"Connection": "close"}) as http:
        got = http.post("/v1/models/half_plus_two:predict", json={"instances": [1.0]})  # waits in the backlog
        assert got.json() == {"predictions": [2.5]}
    deadline = time.monotonic() + 60
    while "starting a new one" not in tfs.output and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"worker {worker} was killed by SIGKILL; starting a new one" in tfs.output
    with tfs_grpc(tfs.grpc_target) as (predict, models):
        answer = predict.Predict(grpc_predict_request("half_plus_two", np.array([4.0], np.float32)), timeout=30)
        assert list(answer.outputs["y"].float_val) == [4.0]
        # on every interface with no --api_keys, TF Serving's reload is off until --management=on
        with pytest.raises(grpc.RpcError) as caught:
            models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(), timeout=30)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED and "--management on" in caught.value.details()


# -- time limits ------------------------------------------------------------------------------------


def test_a_hanging_handler_gets_504_and_others_keep_answering(tmp_path):
    bundle = tmp_path / "bundle"
    write_code(
        bundle / "code",
        """
        import json, time

        def handler(data, context):
            body = data.read().decode()
            if body == "hang":
                time.sleep(3600)
            return json.dumps({"echo": body}), "application/json"
        """,
    )
    import shutil

    shutil.copytree(HALF_PLUS_TWO, bundle / "half_plus_two")
    server = ServerProcess([str(bundle)], env={"SAGEMAKER_GUNICORN_TIMEOUT_SECONDS": "1"}).start()
    try:
        with server.client() as http:
            hung: list[httpx.Response] = []
            threads = [
                threading.Thread(target=lambda: hung.append(http.post("/invocations", content=b"hang")))
                for _ in range(3)
            ]
            for t in threads:
                t.start()
            answers = [http.post("/invocations", content=f"{i}".encode()) for i in range(20)]  # meanwhile
            for t in threads:
                t.join(30)
            assert [a.json() for a in answers] == [{"echo": f"{i}"} for i in range(20)]
            assert [r.status_code for r in hung] == [504] * 3
            assert "limit of 1 s" in hung[0].json()["error"]
            metrics = http.get("/metrics").text
        assert 'tfservo_timeouts_total{model="half_plus_two",route="/invocations"} 3.0' in metrics
        assert sum("timeout: /invocations for model half_plus_two" in line for line in server.lines) == 3
        workers = server.descendants()
        assert workers
    finally:
        server.stop(timeout=5)
    # the three handler threads still sleep: the worker leaves without waiting for them
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()], "a worker outlived its server"


def test_a_hung_handler_is_answered_at_the_containers_30_s_by_default(tmp_path):
    """No time limit given: an invocation gets the SageMaker container's 30 s, then 504."""
    bundle = tmp_path / "bundle"
    write_code(
        bundle / "code",
        """
        import threading

        def handler(data, context):
            threading.Event().wait()  # hangs for good
        """,
    )
    import shutil

    shutil.copytree(HALF_PLUS_TWO, bundle / "half_plus_two")
    server = ServerProcess([str(bundle)]).start()
    try:
        with server.client() as http:
            hung = http.post("/invocations", content=b"{}", headers={"Content-Type": "application/json"})
            assert hung.status_code == 504
            assert "limit of 30 s" in hung.json()["error"]
            assert "SAGEMAKER_GUNICORN_TIMEOUT_SECONDS" in hung.json()["error"]
    finally:
        server.stop(timeout=5)


def test_rest_timeout_and_grpc_deadline_against_a_slow_model(slow_model):
    server = ServerProcess([str(slow_model), "--request-timeout", "0.3"]).start()
    try:
        with server.client() as http:
            got = http.post("/v1/models/slow:predict", json={"instances": [1.0]})
            assert got.status_code == 504 and "limit of 0.3 s" in got.json()["error"]
        with tfs_grpc(server.grpc_target) as (predict, _):
            with pytest.raises(grpc.RpcError) as caught:
                predict.Predict(grpc_predict_request("slow", np.array([1.0], np.float32)), timeout=0.2)
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            answer = predict.Predict(grpc_predict_request("slow", np.array([1.0], np.float32)), timeout=30)
            assert list(answer.outputs["y"].float_val) == [2.0]
    finally:
        server.stop()


def test_rows_whose_deadline_passed_in_the_queue_are_dropped_from_the_batch():
    from tfservo.core import deadlines
    from tfservo.core.batching_options import BatchingOptions
    from tfservo.models.batching.batcher import Batcher

    seen: list[int] = []
    gate = threading.Event()

    def runner(signature, inputs, output_keys):
        gate.wait(10)
        seen.append(len(inputs["x"]))
        return {"y": inputs["x"] + 1}

    options = BatchingOptions(max_batch_size=8, batch_timeout_micros=0, num_batch_threads=1, max_enqueued_batches=8)
    batcher = Batcher(runner, options, name="m")
    try:
        first = threading.Thread(target=lambda: batcher("s", {"x": np.ones(1, np.float32)}))
        first.start()  # occupies the batch thread until the gate opens
        time.sleep(0.2)
        results: dict[str, object] = {}

        def call(name, seconds):
            try:
                with deadlines.within(seconds):
                    results[name] = batcher("s", {"x": np.ones(2, np.float32)})
            except deadlines.DeadlineExceeded as exc:
                results[name] = exc

        late = threading.Thread(target=call, args=("late", 0.1))
        patient = threading.Thread(target=call, args=("patient", 30))
        late.start()
        patient.start()
        late.join(5)
        assert isinstance(results["late"], deadlines.DeadlineExceeded)
        gate.set()
        patient.join(10)
        first.join(10)
        assert isinstance(results["patient"], dict)
        assert seen == [1, 2]  # the late caller's 2 rows never ran
    finally:
        batcher.close()


# -- TLS --------------------------------------------------------------------------------------------


def test_mutual_tls_on_rest_and_grpc(tmp_path):
    pem = certificates(tmp_path)
    ssl_config = tmp_path / "ssl.config"
    ssl_config.write_text(
        f'server_key: "{pem["server.key"].read_text()}"\nserver_cert: "{pem["server.crt"].read_text()}"\n'
        f'custom_ca: "{pem["ca.crt"].read_text()}"\nclient_verify: true\n'
    )
    server = ServerProcess([
        str(HALF_PLUS_TWO), "--tls-cert", str(pem["server.crt"]), "--tls-key", str(pem["server.key"]),
        "--tls-ca", str(pem["ca.crt"]), "--ssl-config-file", str(ssl_config),
    ]).start()
    try:
        assert server.url.startswith("https://")
        import requests

        client_cert = (str(pem["client.crt"]), str(pem["client.key"]))
        got = requests.post(f"{server.url}/v1/models/saved_model_half_plus_two_cpu:predict",
                            json={"instances": [1.0]}, cert=client_cert, verify=str(pem["ca.crt"]), timeout=30)
        assert got.json() == {"predictions": [2.5]}
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):  # no client cert
            requests.get(f"{server.url}/v1/models", verify=str(pem["ca.crt"]), timeout=30)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=pem["ca.crt"].read_bytes(), private_key=pem["client.key"].read_bytes(),
            certificate_chain=pem["client.crt"].read_bytes(),
        )
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        with grpc.secure_channel(server.grpc_target, credentials) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            answer = stub.Predict(grpc_predict_request("saved_model_half_plus_two_cpu", np.array([2.0], np.float32)), timeout=30)
            assert list(answer.outputs["y"].float_val) == [3.0]
        anonymous = grpc.ssl_channel_credentials(root_certificates=pem["ca.crt"].read_bytes())
        with grpc.secure_channel(server.grpc_target, anonymous) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                stub.Predict(grpc_predict_request("saved_model_half_plus_two_cpu", np.array([2.0], np.float32)), timeout=10)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop()


def test_a_worker_stuck_past_the_hard_limit_is_replaced(tmp_path):
    bundle = tmp_path / "bundle"
    write_code(
        bundle / "code",
        """
        import json, time

        def handler(data, context):
            if data.read() == b"hang":
                time.sleep(3600)
            return json.dumps({"ok": True}), "application/json"
        """,
    )
    import shutil

    shutil.copytree(HALF_PLUS_TWO, bundle / "half_plus_two")
    server = ServerProcess([str(bundle), "--workers", "2", "--invocation-timeout", "1"]).start()
    try:
        with server.client() as http:
            assert http.post("/invocations", content=b"hang").status_code == 504
            output = server.wait_for("after it was replaced", timeout=120)
            assert "after it was replaced" in output, output
            assert "is replaced: a call has run" in output and "hard limit of 2 s" in output, output
            answers = [http.post("/invocations", content=b"x").status_code for _ in range(10)]
            assert answers == [200] * 10
        assert server.stop() == 0  # the server itself stops cleanly: the replaced worker is no failure
    finally:
        if server.proc and server.proc.poll() is None:
            server.stop()
