"""Load and faults on a real server, bounded in count and time: admission, starvation, memory,
drains. (The malformed-input battery is tests/test_malformed_input.py; the soak is
bench/soak.py.)"""

from __future__ import annotations

import re
import shutil
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
    with ServerProcess([str(root)]) as server:
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
            started = time.monotonic()
            for _ in range(5):
                assert invoke(client, "fast").text == "quick"
            waited = time.monotonic() - started
            metrics = client.get("/metrics").text
            assert all(f.result().text == "slept" for f in slow)
    assert waited < 2.0, f"the fast model waited {waited:.1f}s behind the slow one"
    queued = re.search(r'^tfservo_pool_queued\{pool="tfservo-invoke"\} ([0-9.]+)$', metrics, re.M)
    assert queued and float(queued[1]) > 0  # the slow model's extra calls waited, visibly


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
