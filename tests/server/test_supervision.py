"""The supervisor every `tfservo serve` runs under: a worker that dies (os._exit, SIGSEGV, the
OOM killer's SIGKILL) is replaced in the default single-worker mode, a worker that leaks memory
past its limit or reaches --max-requests is replaced without a failed request, and the
replacements are logged and counted in /metrics."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import handler_bundle
from server_process import ServerProcess, serving_pids

HANDLER = """
    import os, signal, time

    LEAK = []

    def handler(data, context):
        body = data.read()
        if body == b"exit":
            os._exit(1)
        if body == b"segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if body.startswith(b"sleep"):
            time.sleep(float(body[5:]))
        if body == b"leak":
            LEAK.append(bytearray(os.urandom(1)) * (10 * 2**20))  # 10 MB, every page touched
        return str(os.getpid()), "text/plain"
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return handler_bundle(tmp_path_factory.mktemp("supervised"), HANDLER)


def invoke(client: httpx.Client, body: bytes) -> httpx.Response:
    return client.post("/invocations", content=body, headers={"Content-Type": "text/plain"})


def worker_pids(server: ServerProcess) -> list[int]:
    return serving_pids(server.lines)


def replacements(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    return {m[1]: float(m[2]) for m in re.finditer(r'^tfservo_worker_replacements_total\{reason="(\w+)"\} (\S+)$', text, re.M)}


def resident_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return 0.0


def test_the_lone_default_worker_is_replaced_when_it_dies(bundle) -> None:
    # Each request on a new connection: a kept-alive one to a dead worker is dead too.
    headers = {"Connection": "close"}
    with ServerProcess([str(bundle)]) as server, httpx.Client(base_url=server.url, timeout=120, headers=headers) as client:
        first = current = int(invoke(client, b"pid").text)
        for how in (b"exit", b"segv", b"kill"):
            # the worker that answered last (its serving line may reach the test's pipe a moment later)
            before = current
            if how == b"kill":  # what the OOM killer does
                os.kill(before, signal.SIGKILL)
            else:
                with pytest.raises(httpx.TransportError):  # its own connection dies with it
                    invoke(client, how)
            # The next request waits in the supervisor's backlog for the replacement.
            answer = invoke(client, b"pid")
            assert answer.status_code == 200 and int(answer.text) != before
            current = int(answer.text)
        assert current != first
        assert replacements(client)["died"] == 3
        for told in ("exited with code 1", "was killed by SIGSEGV", "was killed by SIGKILL"):
            assert any(told in line and "starting a new one" in line for line in server.lines), server.output
        assert server.stop() == 0


def test_with_two_workers_connections_opened_together_reach_both(bundle) -> None:
    """Each worker listens on a socket of its own on the port, so the kernel spreads a burst of
    connections over them (with one shared socket the first worker awake took most bursts whole)."""
    with ServerProcess([str(bundle), "--workers", "2"]) as server:
        deadline = time.monotonic() + 120
        while len(worker_pids(server)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        address = httpx.URL(server.url)
        connections = [socket.create_connection((address.host, address.port), timeout=60) for _ in range(16)]
        answered: list[int] = []
        try:
            for conn in connections:  # every one open before any is used
                conn.sendall(b"POST /invocations HTTP/1.1\r\nHost: tfservo\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: 3\r\nConnection: close\r\n\r\npid")
            for conn in connections:
                reply = b""
                while chunk := conn.recv(65536):
                    reply += chunk
                answered.append(int(reply.rsplit(b"\r\n\r\n", 1)[1]))
        finally:
            for conn in connections:
                conn.close()
        assert set(answered) == set(worker_pids(server)[:2]), answered
        assert listening_sockets(address.port) == 2  # the kernel's choice, not whichever worker wakes first


def listening_sockets(port: int) -> int:
    """How many TCP sockets listen on `port` (IPv4, from /proc/net/tcp: state 0A is LISTEN)."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(1 for row in rows if int(row[1].split(":")[1], 16) == port and row[3] == "0A")


def test_with_two_workers_new_connections_reach_the_survivor_while_a_dead_worker_is_replaced(bundle) -> None:
    """A dead worker's socket leaves the port's group at once: connections opened while its
    replacement starts go to the worker alive instead of waiting in the dead one's backlog."""
    with ServerProcess([str(bundle), "--workers", "2"]) as server:
        deadline = time.monotonic() + 120
        while len(worker_pids(server)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        survivor, doomed = worker_pids(server)[:2]
        os.kill(doomed, signal.SIGKILL)
        while not any("starting a new one" in line for line in server.lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        # Each request on a connection of its own, from a port of its own: the kernel's hash
        # would give about half of them to the dead worker's socket if it still listened.
        with httpx.Client(base_url=server.url, timeout=10, headers={"Connection": "close"}) as client:
            answered = {int(invoke(client, b"pid").text) for _ in range(16)}
        assert answered == {survivor}, f"answered by {answered}: some waited for the replacement"
        assert len(worker_pids(server)) == 2, "the replacement served already: the test proved nothing"
        port = httpx.URL(server.url).port
        while len(worker_pids(server)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert listening_sockets(port) == 2  # the replacement's socket listens once it serves


def test_with_two_workers_a_request_in_flight_on_the_other_worker_is_not_lost(bundle) -> None:
    with ServerProcess([str(bundle), "--workers", "2"]) as server:
        deadline = time.monotonic() + 120
        while len(worker_pids(server)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        clients: list[httpx.Client] = []
        try:
            by_pid: dict[int, httpx.Client] = {}
            while len(by_pid) < 2 and len(clients) < 300:  # kept-alive connections, each held by one worker
                clients.append(httpx.Client(base_url=server.url, timeout=60))
                by_pid.setdefault(int(invoke(clients[-1], b"pid").text), clients[-1])
            assert len(by_pid) == 2, "the kernel gave every connection to one worker"
            (slow_pid, slow), (doomed_pid, doomed) = by_pid.items()
            answer: list[httpx.Response] = []
            in_flight = threading.Thread(target=lambda: answer.append(invoke(slow, b"sleep3")))
            in_flight.start()
            time.sleep(0.5)
            with pytest.raises(httpx.TransportError):
                invoke(doomed, b"exit")
            in_flight.join()
            assert answer[0].status_code == 200 and int(answer[0].text) == slow_pid
        finally:
            for client in clients:
                client.close()
        with httpx.Client(base_url=server.url, timeout=60) as client:
            deadline = time.monotonic() + 120
            while replacements(client).get("died") != 1 and time.monotonic() < deadline:
                time.sleep(0.5)
            assert replacements(client)["died"] == 1


def test_a_leaking_worker_is_replaced_without_a_failed_request(bundle) -> None:
    """A handler keeping 10 MB per request; the limit 300 MB above what a worker holds once
    loaded. Every request is answered, and no worker's resident memory passes the limit by
    more than one request (sampled every 20 ms)."""
    with ServerProcess([str(bundle), "--max-worker-memory-mb", "100000"]) as probe:
        loaded_mb = resident_mb(worker_pids(probe)[-1])
    limit_mb = round(loaded_mb + 300)
    with ServerProcess([str(bundle), "--max-worker-memory-mb", str(limit_mb)]) as server, \
            httpx.Client(base_url=server.url, timeout=120) as client:
        peak, done = [0.0], threading.Event()

        def sample() -> None:
            while not done.is_set():
                for pid in set(worker_pids(server)):
                    peak[0] = max(peak[0], resident_mb(pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            statuses = [invoke(client, b"leak").status_code for _ in range(70)]  # 700 MB: two replacements
        finally:
            done.set()
            sampler.join()
        assert statuses == [200] * 70
        assert replacements(client)["memory"] >= 2
        assert peak[0] <= limit_mb + 10 + 5, (peak[0], limit_mb)  # one request, and the sampler's slack
        assert any("passed its limit of" in line and "--max-worker-memory-mb" in line for line in server.lines)
        assert len(set(worker_pids(server))) >= 3


def test_max_requests_recycles_a_worker_with_its_replacement_started_first(bundle) -> None:
    with ServerProcess([str(bundle), "--max-requests", "20"]) as server, \
            httpx.Client(base_url=server.url, timeout=120) as client:
        pids: list[int] = []
        deadline = time.monotonic() + 120
        while len(set(pids)) < 2 and time.monotonic() < deadline:  # the first serves until its replacement does
            answer = invoke(client, b"pid")
            assert answer.status_code == 200
            pids.append(int(answer.text))
            time.sleep(0.1)
        assert len(set(pids)) == 2 and pids.index(pids[-1]) > 20  # the old one answered on past 20
        for _ in range(5):
            assert int(invoke(client, b"pid").text) == pids[-1]
        assert replacements(client)["requests"] >= 1
        assert any("it has answered 20 requests (--max-requests)" in line for line in server.lines)


def test_no_supervisor_serves_in_the_process_itself(bundle) -> None:
    with ServerProcess([str(bundle), "--no-supervisor"]) as server, \
            httpx.Client(base_url=server.url, timeout=60) as client:
        assert int(invoke(client, b"pid").text) == server.proc.pid
        assert "tfservo_worker_replacements_total" not in client.get("/metrics").text


def test_a_worker_over_its_memory_limit_once_loaded_stops_the_server_with_a_clear_error(bundle) -> None:
    with pytest.raises(RuntimeError) as caught:
        ServerProcess([str(bundle), "--max-worker-memory-mb", "50"]).start()
    assert "more than its memory limit of 50 MB" in str(caught.value)


@pytest.fixture(scope="module")
def hanging_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SavedModel with two signatures: `serving_default` (x * 2) and `hang`, which waits for
    an element of a queue nothing ever fills: a model call that never ends, using no CPU."""
    import tensorflow as tf

    root = tmp_path_factory.mktemp("stuck") / "hangs"
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        queue = tf.queue.FIFOQueue(1, tf.float32, shapes=[[]])
        with tf.compat.v1.Session(graph=graph) as session:
            builder = tf.compat.v1.saved_model.Builder(str(root / "1"))
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "serving_default": tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": x * 2}),
                "hang": tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": x + queue.dequeue()}),
            })
            builder.save()
    return str(root)


def test_a_model_call_stuck_in_a_batch_thread_replaces_its_worker(hanging_model) -> None:
    # With the default batching the call runs on a batch thread, where no door's thread pool
    # sees it: the worker watch reads every model call in progress.
    server = ServerProcess([hanging_model, "--request-timeout", "1", "--invocation-timeout", "1"]).start()
    try:
        with server.client() as http:
            stuck = http.post("/v1/models/hangs:predict", json={"signature_name": "hang", "instances": [1.0]})
            assert stuck.status_code == 504, stuck.text
            output = server.wait_for("after it was replaced", timeout=120)
            assert "after it was replaced" in output, output
            assert "is replaced: a call has run" in output and "hard limit of 2 s" in output, output
            answers = [http.post("/v1/models/hangs:predict", json={"instances": [1.0, 2.0]}) for _ in range(5)]
            assert [a.status_code for a in answers] == [200] * 5
            assert answers[-1].json() == {"predictions": [2.0, 4.0]}
            assert replacements(http).get("stuck") == 1.0
            # The stuck call ended (cancelled) as its old worker closed, its loop already gone:
            # the late answer is dropped, not logged as a failure.
            assert "Traceback" not in server.output, server.output
        assert server.stop() == 0
    finally:
        if server.proc and server.proc.poll() is None:
            server.stop()


def test_a_taken_default_grpc_port_moves_and_a_chosen_one_fails(tmp_path) -> None:
    """Two servers started with only --port both start: the default gRPC port (9000) held by
    another moves to a free one, saying so; a --grpc-port the user chose and another holds is
    an error naming it."""
    import subprocess
    import sys

    from conftest import SMC

    model = str(SMC / "resources" / "models" / "half_plus_three")
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", 9000))
        holder.listen()
    except OSError:
        pass  # something else holds it already: as good
    try:
        server = ServerProcess([model])
        server.args = [a for i, a in enumerate(server.args)
                       if not (a == "--grpc-port" or (i and server.args[i - 1] == "--grpc-port"))]
        with server:
            assert "gRPC's default port 127.0.0.1:9000 is taken" in server.output
            target = re.search(r"serving gRPC on (\d+) instead", server.output)
            assert target is not None and f"gRPC on 127.0.0.1:{target[1]}" in server.output
        chosen = subprocess.run([str(Path(sys.executable).with_name("tfservo")), "serve", model, "--port", "0",
                                 "--grpc-port", "9000"], capture_output=True, text=True, timeout=120,
                                env={**os.environ, "SAGEMAKER_GUNICORN_WORKERS": "1"})
        assert chosen.returncode != 0 and "cannot listen for gRPC on 127.0.0.1:9000" in chosen.stderr + chosen.stdout
    finally:
        holder.close()
