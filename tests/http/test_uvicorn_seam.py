"""The contract with uvicorn's internals (tfservo/http/uvicorn_seam.py): the range it was tested
with is the range pyproject.toml requires and holds the installed uvicorn, no other module
reaches into uvicorn's internals, and a real uvicorn server keeps each piece of the contract."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

import httpx
import tomllib
import uvicorn
from packaging.specifiers import SpecifierSet

from tfservo.http.protocol import protocol_class
from tfservo.http.uvicorn_seam import TESTED_VERSIONS, SeamServer

REPO = Path(__file__).resolve().parents[2]
# server_state's fields, the loaded app, the listening servers, the loop's create_server, or a
# subclass of uvicorn's Server (whose startup/shutdown/handle_exit it would override)
INTERNALS = re.compile(r"server_state\.|\.loaded_app|self\.servers\b|create_server|\(uvicorn\.Server\)")


def test_the_tested_range_is_the_required_one_and_holds_the_installed_uvicorn() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (required,) = [d for d in project["dependencies"] if d.startswith("uvicorn")]
    assert SpecifierSet(required.split("]", 1)[1]) == SpecifierSet(TESTED_VERSIONS), required
    assert uvicorn.__version__ in SpecifierSet(TESTED_VERSIONS), (
        f"uvicorn {uvicorn.__version__} is outside {TESTED_VERSIONS}: check uvicorn_seam.py against it, "
        "then move the range here and in pyproject.toml"
    )


def test_no_other_module_uses_uvicorns_internals() -> None:
    users = [
        path.relative_to(REPO).as_posix()
        for path in (REPO / "tfservo").rglob("*.py")
        if path.name != "uvicorn_seam.py" and INTERNALS.search(path.read_text())
    ]
    assert users == []


async def _hello(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


class _Probe(SeamServer):
    started_seen = False
    shutdown_sockets: list[socket.socket] | None = None

    def on_started(self) -> None:
        self.started_seen = True

    async def before_shutdown(self, sockets: list[socket.socket]) -> None:
        self.shutdown_sockets = sockets
        self.connections_at_shutdown = self.open_connections()
        self.close_listeners()


def test_a_real_uvicorn_server_keeps_the_contract() -> None:
    """Started on a socket of ours with tfservo's protocol: it answers through the hooks, counts
    the connection, calls the start and stop hooks, and stops when asked."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    config = uvicorn.Config(_hello, http=protocol_class(header_timeout=10, max_connections=100), lifespan="off", log_config=None, loop="asyncio")
    server = _Probe(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started_seen
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        answer = client.get("/")
        assert (answer.status_code, answer.text) == (200, "hello")
        assert "date" in answer.headers  # uvicorn's default headers, through the hooks
        assert server.open_connections() == 1  # the kept-alive connection, in uvicorn's set
        deadline = time.monotonic() + 5  # counted just after the answer is written
        while server.server_state.total_requests == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.server_state.total_requests == 1  # counted through the hooks
    server.request_exit()
    thread.join(10)
    assert not thread.is_alive() and server.shutdown_sockets == [sock]
