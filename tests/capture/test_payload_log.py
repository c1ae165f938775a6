"""KServe's inference logger on a real server: every inference request and answer reaches a
real HTTP receiver as CloudEvents that the CloudEvents SDK parses, with KServe's attributes;
a receiver that is down slows nothing."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from cloudevents.http import from_http
from conftest import TFS
from http_receiver import start_receiver
from server_process import ServerProcess

MODEL = TFS / "saved_model_half_plus_two_cpu"


def data(event) -> object:
    """An event's data: the SDK gives JSON content types' data already parsed."""
    return event.data if isinstance(event.data, (dict, list)) else json.loads(event.data)


@pytest.fixture
def receiver():
    received: list[tuple[dict[str, str], bytes]] = []

    def take(path: str, headers: dict[str, str], body: bytes) -> int:
        received.append((headers, body))
        return 202

    server, url = start_receiver(take)
    yield url, received
    server.shutdown()


def test_requests_and_answers_arrive_as_kserve_cloudevents(receiver) -> None:
    url, received = receiver
    args = [str(MODEL), "--payload-log-url", url, "--payload-log-namespace", "team-a"]
    with ServerProcess(args) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        client.post("/v1/models/saved_model_half_plus_two_cpu:predict", json={"instances": [1.0]},
                    headers={"X-Amzn-SageMaker-Inference-Id": "req-1"})
        client.post("/invocations", json={"instances": "bad"})  # errors are logged too, as KServe does
        deadline = time.monotonic() + 10
        while len(received) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    events = [from_http(headers, body) for headers, body in received]
    assert len(events) == 4
    by_type: dict[str, list] = {}
    for event in events:
        by_type.setdefault(event["type"], []).append(event)
    requests, answers = by_type["org.kubeflow.serving.inference.request"], by_type["org.kubeflow.serving.inference.response"]
    assert len(requests) == len(answers) == 2
    first = next(e for e in requests if e["id"] == "req-1")
    assert data(first) == {"instances": [1.0]}
    assert first["inferenceservicename"] == "saved_model_half_plus_two_cpu" and first["namespace"] == "team-a"
    assert first["component"] == "predictor" and first["source"].startswith("http://127.0.0.1:")
    answer = next(e for e in answers if e["id"] == "req-1")
    assert data(answer) == {"predictions": [2.5]}
    assert any("error" in data(e) for e in answers)


def test_a_receiver_that_is_down_slows_nothing_and_is_counted() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/"
    with ServerProcess([str(MODEL), "--payload-log-url", dead]) as server, \
            httpx.Client(base_url=server.url, timeout=30) as client:
        for _ in range(50):
            assert client.post("/v1/models/saved_model_half_plus_two_cpu:predict", json={"instances": [1.0]}).status_code == 200
        deadline = time.monotonic() + 10
        while 'tfservo_payload_log_events_total{result="failed"} 100.0' not in (text := client.get("/metrics").text):
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
    assert sum("payload log: sending to" in line for line in server.lines) == 1
