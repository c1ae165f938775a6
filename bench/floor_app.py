"""The transport floor: a do-nothing ASGI app on the HTTP stack tfservo serves with (uvicorn on
uvloop, httptools), reading each request body and answering a fixed body the size of the real
answer. Whatever a server does beyond this is its own cost; "× floor" in the report divides by it.

Usage: python floor_app.py PORT ANSWERS.json [--tfservo-protocol | --granian | --lean]

ANSWERS.json maps each POST path to the text answered there. --tfservo-protocol serves through
tfservo's own protocol class (its header and body time limits and connection cap), so the
report can tell the protocol layer's cost from the rest. --granian serves the same app on
granian (a Rust HTTP server for ASGI apps; run with bench/.venv-tools' Python), the candidate
stack that issue 28 asked to be measured against uvicorn. --lean serves it through a minimal
HTTP/1.1 protocol on httptools written here (keep-alive, Content-Length bodies; the app's
coroutine runs at once in the parser's callback, and only a coroutine that waits gets a task),
the other candidate the issue named: "a leaner protocol on httptools". It is a measurement of
what such a protocol could cost, not a server (no flow control, timeouts or pipelining).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

_JSON = [(b"content-type", b"application/json")]


def make_app(answers: dict[str, bytes]) -> Any:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        body = answers.get(scope["path"], b"{}") if scope["method"] == "POST" else b"{}"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_JSON, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def _answers(path: str) -> dict[str, bytes]:
    return {p: text.encode() for p, text in json.loads(open(path).read()).items()}


def from_env() -> Any:
    """The app for granian's worker process (a factory: granian imports its target by name)."""
    return make_app(_answers(os.environ["FLOOR_ANSWERS"]))


class _LeanProtocol:
    """HTTP/1.1 on httptools with nothing else: one request at a time per connection."""

    def __init__(self, app: Any) -> None:
        import httptools

        self.app = app
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def eof_received(self) -> None:
        pass

    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", [], []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        import asyncio

        path, _, query = self.url.partition(b"?")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": self.parser.get_method().decode("ascii"), "path": path.decode("latin-1"),
                 "raw_path": path, "query_string": query, "headers": self.headers}
        body = b"".join(self.body)
        transport, head = self.transport, []
        keep_alive = self.parser.should_keep_alive()

        async def receive() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                lines = [b"HTTP/1.1 %d OK\r\n" % message["status"]]
                lines += [name + b": " + value + b"\r\n" for name, value in message["headers"]]
                head.append(b"".join(lines) + (b"\r\n" if keep_alive else b"connection: close\r\n\r\n"))
            elif transport is not None:
                transport.write(head.pop() + message.get("body", b""))
                if not keep_alive:
                    transport.close()

        coro = self.app(scope, receive, send)
        try:
            waited = coro.send(None)
        except StopIteration:
            return

        async def rest(waited: Any) -> None:  # what a coroutine that waits needs: a task of its own
            while True:
                if waited is None:
                    await asyncio.sleep(0)
                else:
                    await asyncio.wait([waited])
                try:
                    waited = coro.send(None)
                except StopIteration:
                    return

        asyncio.get_running_loop().create_task(rest(waited))


def _serve_lean(app: Any, port: int) -> None:
    import asyncio

    import uvloop

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(lambda: _LeanProtocol(app), "127.0.0.1", port)
        await server.serve_forever()

    uvloop.install()
    asyncio.run(serve())


def main() -> None:
    port, answers_file = int(sys.argv[1]), sys.argv[2]
    if "--lean" in sys.argv[3:]:
        _serve_lean(make_app(_answers(answers_file)), port)
        return
    if "--granian" in sys.argv[3:]:
        from granian import Granian

        os.environ["FLOOR_ANSWERS"] = answers_file
        # One worker, its Python on one uvloop thread, as tfservo's one worker on uvicorn;
        # "asginl": ASGI without lifespan (the app has none).
        Granian("floor_app:from_env", address="127.0.0.1", port=port, interface="asginl", workers=1,
                runtime_mode="st", loop="uvloop", factory=True, log_level="warning",
                working_dir=Path(__file__).resolve().parent).serve()
        return
    import uvicorn

    answers = _answers(answers_file)
    http: Any = "httptools"
    if "--tfservo-protocol" in sys.argv[3:]:
        from tfservo.http.protocol import default_max_connections, protocol_class

        http = protocol_class(header_timeout=60, max_connections=default_max_connections())
    uvicorn.run(make_app(answers), host="127.0.0.1", port=port, loop="uvloop", http=http, ws="none",
                lifespan="off", access_log=False, log_level="warning")


if __name__ == "__main__":
    main()
