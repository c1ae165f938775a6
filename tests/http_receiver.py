"""A real HTTP server on loopback that takes POSTs (log receivers, OTLP over HTTP) for tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# (path, headers, body) → the status to answer
OnPost = Callable[[str, dict[str, str], bytes], int]


def start_receiver(on_post: OnPost) -> tuple[ThreadingHTTPServer, str]:
    """The running server (shutdown() it) and its base URL, ending in /."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(on_post(self.path, dict(self.headers.items()), body))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"
