"""Load and faults on a real server, bounded in count and time: admission, starvation, memory,
drains. (The malformed-input battery is tests/http/test_malformed_input.py; the soak is
bench/soak.py.)"""

from __future__ import annotations

import json
import re
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from conftest import SMC, write_code
from server_process import ServerProcess

HP3 = SMC / "resources" / "models" / "half_plus_three"

SLOW = """
    import time

    def handler(data, context):
        time.sleep(float(data.read() or 2))
        return "slept", "text/plain"
"""
FAST = """
    def handler(data, context):
        return "quick", "text/plain"
"""


@pytest.fixture(scope="module")
def two_handlers(tmp_path_factory):
    root = tmp_path_factory.mktemp("starve")
    for name, code in (("slow", SLOW), ("fast", FAST)):
        shutil.copytree(HP3 / "00000124", root / name / "00000124")
        write_code(root / name / "code", code)
    with ServerProcess([str(root), "--max-queued-per-model", "30"]) as server:
        yield server


def invoke(client: httpx.Client, model: str, body: bytes = b"") -> httpx.Response:
    return client.post("/invocations", content=body, headers={
        "Content-Type": "text/plain", "X-Amzn-SageMaker-Custom-Attributes": f"tfs-model-name={model}",
    })


def test_a_slow_handler_cannot_starve_other_models(two_handlers) -> None:
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    with httpx.Client(base_url=two_handlers.url, timeout=60, limits=limits) as client:
        with ThreadPoolExecutor(70) as pool:
            slow = [pool.submit(invoke, client, "slow", b"3") for _ in range(70)]  # more than the pool's threads
            time.sleep(0.5)
            for _ in range(5):
                assert invoke(client, "fast").text == "quick"
            # Answered while every slow call still sleeps: nothing waited behind them.
            waited_behind = sum(f.done() for f in slow)
            metrics = client.get("/metrics").text
            assert all(f.result().text == "slept" for f in slow)
    assert waited_behind == 0, f"the fast model was answered only after {waited_behind} slow calls ended"
    queued = re.search(r'^tfservo_pool_queued\{pool="tfservo-invoke"\} ([0-9.]+)$', metrics, re.M)
    assert queued and float(queued[1]) > 0  # the slow model's extra calls waited, visibly


def test_calls_past_a_models_queue_bound_get_503_with_retry_after_at_once(two_handlers) -> None:
    """48 of the 64 invocation threads per model, 30 more waiting (--max-queued-per-model 30):
    of 85 slow calls 7 are refused at once, on /invocations and on the runtime API alike, and
    the other model is still answered."""
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    with httpx.Client(base_url=two_handlers.url, timeout=60, limits=limits) as client:
        with ThreadPoolExecutor(90) as pool:
            slow = [pool.submit(invoke, client, "slow", b"3") for _ in range(78)]
            time.sleep(1.0)
            refused = [invoke(client, "slow", b"3") for _ in range(5)]
            runtime = [client.post("/endpoints/any/invocations", content=b"3", headers={
                "Content-Type": "text/plain", "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=slow",
            }) for _ in range(2)]
            assert invoke(client, "fast").text == "quick"
            assert not any(f.done() for f in slow)  # refused while all 78 still run or wait
            assert [f.result().text for f in slow] == ["slept"] * 78
    for answer in refused:
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        assert "--max-queued-per-model 30" in answer.json()["error"]
    for answer in runtime:
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        assert answer.headers["x-amzn-errortype"] == "ServiceUnavailable" and "waiting" in answer.json()["message"]


def test_batching_defaults_absorb_64_clients_without_429(tmp_path) -> None:
    with ServerProcess([str(HP3), "--enable-batching"], env={"SAGEMAKER_TFS_MAX_BATCH_SIZE": "8"}) as server:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        statuses: list[int] = []
        lock = threading.Lock()
        deadline = time.monotonic() + 5

        def client_loop() -> None:
            with httpx.Client(base_url=server.url, timeout=30, limits=limits) as client:
                while time.monotonic() < deadline:
                    code = client.post("/v1/models/half_plus_three:predict", content=b'{"instances": [1.0]}').status_code
                    with lock:
                        statuses.append(code)

        threads = [threading.Thread(target=client_loop) for _ in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(statuses) > 200 and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}


def test_bodies_past_the_decode_budget_get_503_with_retry_after() -> None:
    body = b'{"instances": [' + b",".join([b"1.0"] * (2 * 2**20)) + b"]}"  # 8 MiB
    with ServerProcess([str(HP3), "--max-decoding-mb", "10", "--max-request-mb", "64"]) as server, \
            httpx.Client(base_url=server.url, timeout=60) as client:
        host, port = server.url.removeprefix("http://").split(":")
        head = (f"POST /v1/models/half_plus_three:predict HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection((host, int(port)), timeout=60) as held:
            held.sendall(head + body[:1024])  # 8 MiB declared, most of it still to come
            for _ in range(50):
                refused = client.post("/v1/models/half_plus_three:predict", content=body)
                if refused.status_code == 503:
                    break
                time.sleep(0.1)
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"] == "1"
            assert "--max-decoding-mb 10" in refused.json()["error"]
            # A small request still fits beside the held one; /invocations is held to the same bound.
            small = client.post("/v1/models/half_plus_three:predict", content=b'{"instances": [1.0]}')
            assert small.json() == {"predictions": [3.5]}
            invocation = client.post("/invocations", content=body, headers={"Content-Type": "application/json"})
            assert invocation.status_code == 503
            held.sendall(body[1024:])
            answer = b""
            while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < 20:
                answer += held.recv(1 << 20)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        # Released once answered: the same body goes through now.
        done = client.post("/v1/models/half_plus_three:predict", content=body)
        assert done.status_code == 200 and len(json.loads(done.content)["predictions"]) == 2 * 2**20


def test_the_decode_budget_is_the_servers_across_its_workers() -> None:
    """With two workers, a body held on one counts against requests whichever worker takes them."""
    body = b'{"instances": [' + b",".join([b"1.0"] * (2 * 2**20)) + b"]}"  # 8 MiB
    args = [str(HP3), "--workers", "2", "--max-decoding-mb", "10", "--max-request-mb", "64"]
    with ServerProcess(args) as server:
        host, port = server.url.removeprefix("http://").split(":")
        head = (f"POST /v1/models/half_plus_three:predict HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection((host, int(port)), timeout=60) as held:
            held.sendall(head + body[:1024])
            time.sleep(0.5)  # the held request reaches its worker's budget
            for _ in range(12):  # fresh connections, spread over both workers by the kernel (all 12
                # on the held one, by chance: 1 in 4096)
                with httpx.Client(base_url=server.url, timeout=60) as client:
                    refused = client.post("/v1/models/half_plus_three:predict", content=body)
                    assert refused.status_code == 503, refused.text
                    assert "--max-decoding-mb 10" in refused.json()["error"]
            held.sendall(body[1024:])
            answer = b""
            while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < 20:
                answer += held.recv(1 << 20)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert client.post("/v1/models/half_plus_three:predict", content=body).status_code == 200


def peak_rss_during(pid: int, call) -> tuple[int, int]:
    """(resident bytes before, peak resident bytes while `call()` runs) of process `pid`: the
    kernel's high-water mark, reset first (clear_refs), else sampled every 5 ms."""
    def status(key: str) -> int:
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M)[1]) * 1024

    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        resettable = True
    except OSError:
        resettable = False
    before = peak = status("VmRSS")
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.005):
            peak = max(peak, status("VmRSS"))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        call()
    finally:
        done.set()
        sampler.join()
    return before, max(peak, status("VmHWM")) if resettable else peak


@pytest.mark.parametrize("route, content_type, body", [
    ("/v1/models/half_plus_three:predict", "application/json", b'{"instances": [' + b"0.123456789," * 9_000_000 + b"1]}"),
    ("/invocations", "application/json", b'{"instances": [' + b"0.123456789," * 9_000_000 + b"1]}"),
    ("/invocations", "text/csv", b"0.123456789\n" * 8_300_000),
], ids=["predict-json", "invocations-json", "invocations-csv"])
def test_a_99_mb_body_peaks_under_4x_its_size(large_bodies, route, content_type, body) -> None:
    assert len(body) > 99_000_000
    with httpx.Client(base_url=large_bodies.url, timeout=120) as client:
        answers = []
        before, peak = peak_rss_during(large_bodies.proc.pid, lambda: answers.append(
            client.post(route, content=body, headers={"Content-Type": content_type})))
    assert answers[0].status_code == 200, answers[0].text[:300]
    assert b"3.0617285, 3.0617285" in answers[0].content[:200]
    assert peak - before < 4 * len(body), f"{(peak - before) / len(body):.2f}x the body"


@pytest.fixture(scope="module")
def large_bodies():
    with ServerProcess([str(HP3), "--max-request-mb", "128"]) as server:
        yield server
