"""The HTTP protocol layer on a real server: malformed requests and upgrades answer JSON at
once, slow and idle clients are cut off on time, and too many connections cannot lock others out."""

from __future__ import annotations

import collections
import json
import socket
import struct
import threading
import time

import httpx
import pytest
from certificates import certificates
from conftest import TFS
from server_process import ServerProcess

MODEL = TFS / "saved_model_half_plus_two_cpu"


@pytest.fixture(scope="module")
def server():
    args = [str(MODEL), "--header-timeout", "1", "--keep-alive-timeout", "1", "--max-connections", "40",
            "--body-timeout", "2", "--min-body-rate", "100"]
    with ServerProcess(args) as proc:
        yield proc


def raw(server: ServerProcess, data: bytes, timeout: float = 5.0) -> bytes:
    """Send bytes on a fresh connection, read until the server closes it."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def status_and_json(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), answer
    return int(head.split(b" ", 2)[1]), json.loads(body)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /invocations HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\nContent-Length: 2\r\n\r\n{}",
        b"\xef\xbb\xbfGET /ping HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /ping HTTP/9.9\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello on the plain port
    ],
    ids=["control-character", "byte-order-mark", "bad-version", "tls-on-plain"],
)
def test_malformed_http_answers_400_in_json(server, request_bytes) -> None:
    status, doc = status_and_json(raw(server, request_bytes))
    assert status == 400 and doc["error"].startswith("Malformed HTTP request")


def test_an_upgrade_request_is_answered_at_once(server) -> None:
    body = b'{"instances": [1.0]}'
    answer = raw(server, b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                         b"Upgrade: websocket\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    status, doc = status_and_json(answer)
    assert status == 400 and "upgrades" in doc["error"]  # within raw()'s 5 s (the header timeout is 1 s)


def segments_in(sock: socket.socket) -> int:
    """The TCP segments with data this socket has received (tcp_info's tcpi_data_segs_in, Linux
    4.6 and later): a bare ACK, which the server's kernel sends on its own when an answer takes
    longer than its delayed-ACK timer (a loaded machine), is not counted."""
    return struct.unpack_from("I", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256), 152)[0]


def exchange(sock: socket.socket, request: bytes) -> tuple[bytes, bytes]:
    """Send one request on a kept-alive connection; its answer's head and body (none for HEAD)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if request.startswith(b"HEAD "):
        return head, body
    length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")).split(b":")[1])
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


def test_an_answer_leaves_in_one_segment_and_a_head_request_still_gets_its_head(server) -> None:
    # uvicorn writes a response's status line and headers, then its body, each at once: two
    # segments and two wake-ups of the client per answer. ServingProtocol holds the head for the
    # body when Content-Length says one follows; a HEAD answer, which has none, is not held.
    host, port = server.url.removeprefix("http://").split(":")
    predict = b'{"instances": [1.0, 2.0]}'
    requests = [
        b"POST /v1/models/saved_model_half_plus_two_cpu:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(predict), predict),
        b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(predict), predict),
        b"GET /v1/models/saved_model_half_plus_two_cpu HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/models/nope HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        exchange(sock, requests[0])  # the first answer may carry the ACK of a new connection's quick-ack mode
        for request in requests:
            before = segments_in(sock)
            head, body = exchange(sock, request)
            assert segments_in(sock) - before == 1, (request, head)
            assert head.startswith((b"HTTP/1.1 200", b"HTTP/1.1 404")) and json.loads(body), (head, body)
        head, body = exchange(sock, b"HEAD /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and body == b"", head
        head, body = exchange(sock, requests[0])  # the connection still serves after the HEAD
        assert json.loads(body) == {"predictions": [2.5, 3.0]}


PREDICT = b"POST /v1/models/saved_model_half_plus_two_cpu:predict HTTP/1.1\r\nHost: x\r\n"


def predict_request(body: bytes) -> bytes:
    return PREDICT + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def answers(sock: socket.socket, count: int) -> list[tuple[bytes, bytes]]:
    """The next `count` answers on a connection (each with a Content-Length): heads and bodies."""
    data, out = bytearray(), []
    while len(out) < count:
        while (end := data.find(b"\r\n\r\n")) < 0:
            chunk = sock.recv(1 << 20)
            assert chunk, (out, bytes(data))
            data += chunk
        head = bytes(data[:end])
        length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
                     .split(b":")[1])
        del data[: end + 4]
        while len(data) < length:
            chunk = sock.recv(1 << 20)
            assert chunk, (out, head)
            data += chunk
        out.append((head, bytes(data[:length])))
        del data[:length]
    return out


def test_pipelined_requests_are_answered_in_order_on_one_connection(server) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(predict_request(b'{"instances": [1.0]}') + b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
                     + predict_request(b'{"instances": [5.0]}'))
        (head1, body1), (head2, body2), (head3, body3) = answers(sock, 3)
    assert head1.startswith(b"HTTP/1.1 200") and json.loads(body1) == {"predictions": [2.5]}
    assert head2.startswith(b"HTTP/1.1 200") and body2 == b""
    assert head3.startswith(b"HTTP/1.1 200") and json.loads(body3) == {"predictions": [4.5]}


def test_expect_100_continue_gets_the_go_ahead_before_the_body_is_sent(server) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    body = b'{"instances": [3.0]}'
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(PREDICT + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        ((head, answer),) = answers(sock, 1)
    assert head.startswith(b"HTTP/1.1 200") and json.loads(answer) == {"predictions": [3.5]}


def test_a_chunked_request_body_is_read_whole(server) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    parts = [b'{"instances": ', b"[1.0, 2.0]}"]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(PREDICT + b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
        ((head, answer),) = answers(sock, 1)
    assert head.startswith(b"HTTP/1.1 200") and json.loads(answer) == {"predictions": [2.5, 3.0]}


def test_answers_larger_than_the_socket_takes_wait_for_a_client_that_reads_late(server) -> None:
    # Two pipelined requests whose answers fill the socket's buffers while the
    # client reads nothing: the second answer waits for the transport to drain, and both arrive whole.
    host, port = server.url.removeprefix("http://").split(":")
    rows = 1_000_000  # ~5 MB an answer: more than the kernel's send buffer holds (tcp_wmem: 4 MB)
    body = b'{"instances": [' + b",".join([b"1.0"] * rows) + b"]}"
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(predict_request(body) + predict_request(body))
        time.sleep(1.0)
        got = answers(sock, 2)
    for head, answer in got:
        assert head.startswith(b"HTTP/1.1 200")
        assert json.loads(answer) == {"predictions": [2.5] * rows}


def test_http_1_0_is_answered_then_closed_and_1_1_is_kept_alive_until_its_timeout(server) -> None:
    answer = raw(server, b"GET /ping HTTP/1.0\r\n\r\n")  # raw() returns once the server closes
    assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" in answer.lower()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answers(sock, 1)[0][0].startswith(b"HTTP/1.1 200")
        time.sleep(0.3)  # within the keep-alive timeout (1 s): the connection still serves
        sock.sendall(predict_request(b'{"instances": [1.0]}'))
        assert json.loads(answers(sock, 1)[0][1]) == {"predictions": [2.5]}
        assert sock.recv(1) == b""  # closed by the server once idle past the timeout (within recv's 5 s)


def test_idle_and_slow_clients_are_closed_on_time_while_others_are_served(server) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    idle = [socket.create_connection((host, int(port))) for _ in range(10)]
    slow = socket.create_connection((host, int(port)))
    for byte in b"GET /ping HT":  # a byte every 0.2 s: the headers never complete in time
        try:
            slow.sendall(bytes([byte]))
        except OSError:
            break
        with httpx.Client(base_url=server.url, timeout=5) as client:  # others keep their answers
            assert client.get("/ping").status_code == 200
        time.sleep(0.2)
    for sock in [*idle, slow]:
        sock.settimeout(5)
        data = sock.recv(65536)
        assert data.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in data
        assert sock.recv(1) == b""  # closed
        sock.close()


def test_a_kept_alive_connection_whose_next_request_dribbles_gets_408(server) -> None:
    """The header limit also holds for a connection's later requests, not only its first."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        started, answer = time.monotonic(), b""
        for byte in b"GET /ping HTTP/1.1\r\nHost":
            sock.sendall(bytes([byte]))
            sock.settimeout(0.2)
            try:
                answer = sock.recv(65536)
                break
            except TimeoutError:
                continue
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in answer, answer
        assert time.monotonic() - started < 4


def test_a_body_trickling_a_byte_a_second_gets_408_and_a_steady_one_is_answered(server) -> None:
    """--body-timeout 2 --min-body-rate 100: 2 s for a body, plus 1 s per 100 bytes received."""
    host, port = server.url.removeprefix("http://").split(":")
    head = b"POST /v1/models/saved_model_half_plus_two_cpu:predict HTTP/1.1\r\nHost: x\r\n"
    body = b'{"instances": [' + b", ".join([b"1.0"] * 300) + b"]}"
    with socket.create_connection((host, int(port)), timeout=10) as slow:
        slow.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
        started, answer = time.monotonic(), b""
        for byte in body:  # a byte a second: 2 s plus 0.01 s per byte, long before the body ends
            try:
                slow.sendall(bytes([byte]))
                slow.settimeout(1)
                answer = slow.recv(65536)
                break
            except TimeoutError:
                continue
            except OSError:
                break
        assert answer.startswith(b"HTTP/1.1 408") and b"request body did not arrive in time" in answer, answer
        assert time.monotonic() - started < 10
    # a body in pieces, 0.5 s apart, keeps up with 100 bytes a second: answered
    with socket.create_connection((host, int(port)), timeout=10) as steady:
        steady.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
        for i in range(0, len(body), 200):
            steady.sendall(body[i : i + 200])
            time.sleep(0.5)
        chunks = []
        while chunk := steady.recv(65536):
            chunks.append(chunk)
        status, answer_json = status_and_json(b"".join(chunks))
        assert status == 200 and len(answer_json["predictions"]) == 300


def test_past_the_limit_idle_connections_make_room_and_only_busy_ones_refuse(server) -> None:
    """--max-connections 40: 60 silent connections close the oldest 20 without an answer (nginx's
    reuse of idle connections) and clients keep being served; with 40 connections each busy with
    a request, a new one is refused with 503."""
    host, port = server.url.removeprefix("http://").split(":")
    silent = [socket.create_connection((host, int(port))) for _ in range(60)]
    try:
        with httpx.Client(base_url=server.url, timeout=5) as client:
            assert client.get("/ping").status_code == 200
        closed = []
        for sock in silent:
            sock.settimeout(0.5)
            try:
                if sock.recv(65536) == b"":
                    closed.append(sock)
            except TimeoutError:
                pass
        assert len(closed) >= 20 and silent[0] in closed and silent[-1] not in closed
    finally:
        for sock in silent:
            sock.close()
    time.sleep(0.2)
    busy = [socket.create_connection((host, int(port))) for _ in range(40)]
    try:
        for sock in busy:
            sock.sendall(b"GET /ping HTTP/1.1\r\n")  # a request under way: not idle
        time.sleep(0.2)
        with socket.create_connection((host, int(port)), timeout=5) as refused:
            status, doc = status_and_json(refused.recv(65536))  # answered before it sends a byte
        assert status == 503 and "--max-connections" in doc["error"]
    finally:
        for sock in busy:
            sock.close()
    time.sleep(0.2)
    with httpx.Client(base_url=server.url, timeout=5) as client:
        assert client.get("/ping").status_code == 200


def test_silent_connections_beyond_the_file_limit_do_not_lock_clients_out() -> None:
    """1,100 connections that never send a byte, against a server whose file limit is 1,024,
    while clients keep predicting, each on a new connection: no client sees a 503 or a reset."""
    args = [str(MODEL), "--header-timeout", "5"]
    with ServerProcess(args, file_limit=1024) as proc:
        host, port = proc.url.removeprefix("http://").split(":")
        statuses: list[int] = []
        errors: list[str] = []
        done = threading.Event()

        def predict() -> None:
            with httpx.Client(base_url=proc.url, timeout=10) as client:
                while not done.is_set():
                    try:
                        answer = client.post("/v1/models/saved_model_half_plus_two_cpu:predict",
                                             json={"instances": [1.0]}, headers={"Connection": "close"})
                        statuses.append(answer.status_code)
                    except httpx.TransportError as exc:
                        errors.append(repr(exc))

        clients = [threading.Thread(target=predict) for _ in range(4)]
        for thread in clients:
            thread.start()
        silent = []
        try:
            for _ in range(1100):
                silent.append(socket.create_connection((host, int(port))))
            time.sleep(2)
        finally:
            done.set()
            for thread in clients:
                thread.join()
            for sock in silent:
                sock.close()
        assert statuses and set(statuses) == {200}, collections.Counter(statuses)
        assert not errors, errors[:3]


def test_a_tls_handshake_that_never_finishes_is_closed_after_the_header_timeout(tmp_path) -> None:
    pem = certificates(tmp_path)
    args = [str(MODEL), "--header-timeout", "1", "--tls-cert", str(pem["server.crt"]), "--tls-key", str(pem["server.key"])]
    with ServerProcess(args) as proc:
        host, port = proc.url.removeprefix("https://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as silent, \
                socket.create_connection((host, int(port)), timeout=10) as half:
            half.sendall(b"\x16\x03\x01\x02\x00\x01")  # the first bytes of a ClientHello, then nothing
            started = time.monotonic()
            assert silent.recv(1) == b"" and half.recv(1) == b""
            assert time.monotonic() - started < 8  # asyncio's own limit is 60 s
        answer = httpx.get(f"{proc.url}/ping", verify=str(pem["ca.crt"]), timeout=10)
        assert answer.status_code == 200


@pytest.mark.parametrize(
    ("request_bytes", "status", "says"),
    [
        (b"GET /ping?" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "request line is longer than 8192"),
        (b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n", 431, "Request headers too large"),
        (b"GET /ping HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 4000) for i in range(10)) + b"\r\n",
         431, "more than 32768 bytes in all"),
    ],
    ids=["long-request-line", "100-KB-header", "many-headers"],
)
def test_request_lines_and_headers_past_their_limits_answer_414_and_431(server, request_bytes, status, says) -> None:
    got, body = status_and_json(raw(server, request_bytes))
    assert got == status and says in body["error"], body
    ok = httpx.get(server.url + "/ping", headers={f"X-H{i}": "v" * 4000 for i in range(7)})  # 28 KB: within
    assert ok.status_code == 200


def test_endless_headers_on_many_connections_keep_memory_flat_and_others_served(server) -> None:
    """Four connections each sending one endless header are answered 431 after ~40 KB each,
    and the worker's memory stays where it was."""
    import psutil

    host, port = server.url.removeprefix("http://").split(":")

    def rss() -> int:  # the server's processes, supervisor and workers
        return sum(psutil.Process(pid).memory_info().rss for pid in [server.proc.pid, *server.descendants()])

    before = rss()
    answers: list[bytes] = []

    def flood() -> None:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Endless: ")
            try:
                for _ in range(4096):  # up to 64 MB, if nothing stopped it
                    sock.sendall(b"a" * 16384)
            except OSError:
                pass  # the server answered and closed
            answers.append(sock.recv(65536))

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for thread in threads:
        thread.start()
    assert httpx.get(server.url + "/ping", timeout=10).status_code == 200
    for thread in threads:
        thread.join(60)
    assert len(answers) == 4 and all(a.startswith(b"HTTP/1.1 431") for a in answers), answers
    assert rss() - before < 50 * 2**20
