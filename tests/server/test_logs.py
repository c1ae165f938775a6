"""Logs for machines on a real server: --log-format json gives one JSON object per line,
--access-log one line per request with its method, path, status, model, version, bytes,
duration and inference id."""

from __future__ import annotations

import json
import time

import httpx
from conftest import TFS
from server_process import ServerProcess

MODEL = TFS / "saved_model_half_plus_two_cpu"


def test_json_lines_with_an_access_line_per_request() -> None:
    with ServerProcess([str(MODEL), "--log-format", "json", "--access-log"]) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            client.post("/invocations", json={"instances": [1.0]}, headers={"X-Amzn-SageMaker-Inference-Id": "id-7"})
            client.post("/v1/models/saved_model_half_plus_two_cpu:predict", json={"instances": "bad"})
        deadline = time.monotonic() + 10
        while sum('"tfservo.access"' in line for line in server.lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        server.stop()
    not_json = [line for line in server.lines if not line.startswith("{")]
    assert not not_json, not_json  # every line: a log line, and JSON
    docs = [json.loads(line) for line in server.lines]
    assert all({"time", "level", "logger", "message"} <= doc.keys() for doc in docs)
    assert any(doc["logger"] == "tfservo.server" and doc["message"].startswith("serving ") for doc in docs)
    access = [doc for doc in docs if doc["logger"] == "tfservo.access"]
    invocation = next(doc for doc in access if doc["path"] == "/invocations")
    assert invocation["verb"] == "POST" and invocation["status"] == "200" and invocation["inference_id"] == "id-7"
    assert invocation["model"] == "saved_model_half_plus_two_cpu" and invocation["bytes"] > 0 and invocation["ms"] > 0
    predict = next(doc for doc in access if doc["path"].endswith(":predict"))
    assert predict["status"] == "400" and predict["model"] == "saved_model_half_plus_two_cpu"


def test_text_stays_the_default_and_request_lines_need_the_flag() -> None:
    with ServerProcess([str(MODEL)]) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            client.post("/invocations", json={"instances": [1.0]})
        server.stop()
    assert not any(line.startswith("{") for line in server.lines)
    assert not any("tfservo.access" in line for line in server.lines)
