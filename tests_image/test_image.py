"""The container image, as SageMaker, KServe and TF Serving's Docker docs run it: built from a
debootstrapped base (scripts/test-image builds it), started with `docker run`."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import uuid

import grpc
import httpx
import numpy as np
import pytest
from conftest import TFS, grpc_predict_request, tfs_grpc

IMAGE = os.environ.get("TFSERVO_IMAGE", "tfservo:test")
MODEL = TFS / "saved_model_half_plus_two_cpu"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Container:
    def __init__(self, *args: str) -> None:
        self.name = f"tfservo-test-{uuid.uuid4().hex[:8]}"
        subprocess.run(["docker", "run", "-d", "--name", self.name, "--network", "host", *args],
                       check=True, capture_output=True, timeout=120)

    def logs(self) -> str:
        done = subprocess.run(["docker", "logs", self.name], capture_output=True, text=True, timeout=60)
        return done.stdout + done.stderr

    def wait_http(self, url: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{url} never answered 200:\n{self.logs()}")

    def exec(self, *command: str) -> str:
        return subprocess.run(["docker", "exec", self.name, *command], capture_output=True, text=True,
                              check=True, timeout=60).stdout

    def remove(self) -> None:
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True, timeout=60)


@pytest.fixture(scope="module", autouse=True)
def image_exists():
    done = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, timeout=60)
    assert done.returncode == 0, f"image {IMAGE} not found: run scripts/test-image (it builds it)"


def test_docker_run_image_serve_as_sagemaker_does():
    port, grpc_port = free_port(), free_port()
    box = Container("-e", f"SAGEMAKER_BIND_TO_PORT={port}", "-e", f"TFSERVO_GRPC_PORT={grpc_port}",
                    "-v", f"{MODEL}:/opt/ml/model:ro", IMAGE, "serve")
    try:
        box.wait_http(f"http://127.0.0.1:{port}/ping")
        got = httpx.post(f"http://127.0.0.1:{port}/invocations", json={"instances": [1.0, 2.0]}, timeout=30)
        assert got.json() == {"predictions": [2.5, 3.0]}
        assert box.exec("id", "-u").strip() == "1000"  # not root
        assert box.exec("sh", "-c", "command -v serve").strip() == "/opt/tfservo/bin/serve"
        assert "on http://0.0.0.0:" in box.logs()
    finally:
        box.remove()


def test_kserve_runtime_arguments():
    rest, grpc_port = free_port(), free_port()
    box = Container("-v", f"{MODEL}:/mnt/models:ro", IMAGE, "tensorflow_model_server",
                    "--model_name=half_plus_two", f"--port={grpc_port}", f"--rest_api_port={rest}",
                    "--model_base_path=/mnt/models", "--rest_api_timeout_in_ms=60000")
    try:
        box.wait_http(f"http://127.0.0.1:{rest}/v1/models/half_plus_two")
        got = httpx.post(f"http://127.0.0.1:{rest}/v1/models/half_plus_two:predict", json={"instances": [3.0]}, timeout=30)
        assert got.json() == {"predictions": [3.5]}
        with tfs_grpc(f"127.0.0.1:{grpc_port}") as (predict, _):
            answer = predict.Predict(grpc_predict_request("half_plus_two", np.array([1.0], np.float32)), timeout=30)
            assert list(answer.outputs["y"].float_val) == [2.5]
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        # A worker killed as the OOM killer would: the supervisor replaces it (a small model gets a
        # worker per core, so the count depends on the machine).
        worker = re.search(r"pids? (\d+)(?:, \d+)* of \d+ workers", box.logs())[1]
        box.exec("sh", "-c", f"kill -9 {worker}")
        deadline = time.monotonic() + 120
        while "starting a new one" not in box.logs() and time.monotonic() < deadline:
            time.sleep(0.5)
        box.wait_http(f"http://127.0.0.1:{rest}/v1/models/half_plus_two")
        got = httpx.post(f"http://127.0.0.1:{rest}/v1/models/half_plus_two:predict", json={"instances": [3.0]}, timeout=30)
        assert got.json() == {"predictions": [3.5]}
    finally:
        box.remove()


def test_tf_serving_image_environment():
    rest, grpc_port = free_port(), free_port()
    box = Container("-e", "MODEL_NAME=half_plus_two", "-v", f"{MODEL}:/models/half_plus_two:ro", IMAGE,
                    "tensorflow_model_server", f"--port={grpc_port}", f"--rest_api_port={rest}")
    try:
        box.wait_http(f"http://127.0.0.1:{rest}/v1/models/half_plus_two")
        got = httpx.post(f"http://127.0.0.1:{rest}/v1/models/half_plus_two:predict", json={"instances": [5.0]}, timeout=30)
        assert got.json() == {"predictions": [4.5]}
    finally:
        box.remove()
