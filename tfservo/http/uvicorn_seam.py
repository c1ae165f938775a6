"""Every use tfservo makes of uvicorn beyond its documented API, fenced in this one module.

uvicorn runs the server around tfservo's own HTTP/1.1 protocol (http/protocol.py): it listens,
serves the sockets it is given, handles signals and stops. What that needs of uvicorn's
internals — the per-connection protocol's constructor contract (`config.loaded_app`,
`server_state.connections / tasks / default_headers / total_requests`), `Server.servers`, the
`startup` / `shutdown` / `handle_exit` overrides and the TLS handshake's time limit through
`loop.create_server` — is written here and nowhere else, for the uvicorn versions in
`TESTED_VERSIONS` (pyproject.toml pins the same range; tests/http/test_uvicorn_seam.py fails
when either moves, or when the installed uvicorn no longer keeps the contract).
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import uvicorn

__all__ = ["TESTED_VERSIONS", "ProtocolHooks", "SeamServer", "protocol_hooks"]

TESTED_VERSIONS = ">=0.54,<0.55"  # the range pyproject.toml requires


@dataclass
class ProtocolHooks:
    """What a connection's protocol takes from the uvicorn server that made it."""

    app: Any
    connections: set[Any]  # uvicorn's shutdown closes these
    tasks: set[asyncio.Task[None]]  # and awaits these
    default_headers: list[tuple[bytes, bytes]]  # Server / Date, as uvicorn keeps them current
    root_path: str
    keep_alive_timeout: float
    answered: Callable[[], None]  # one more request answered (uvicorn's --limit-max-requests)


def protocol_hooks(config: Any, server_state: Any) -> ProtocolHooks:
    """The hooks of a protocol that uvicorn constructs as `protocol(config, server_state, app_state)`."""
    if not config.loaded:
        config.load()

    def answered() -> None:
        server_state.total_requests += 1

    return ProtocolHooks(
        config.loaded_app, server_state.connections, server_state.tasks, server_state.default_headers,
        config.root_path, config.timeout_keep_alive, answered,
    )


class SeamServer(uvicorn.Server):
    """uvicorn's server with the hooks tfservo's stop needs: `on_started` once it accepts,
    `before_shutdown` before uvicorn's own shutdown, `on_signal` (True: handled, uvicorn does
    nothing), the open connections, closing the listeners, asking it to exit."""

    def __init__(self, config: uvicorn.Config, tls_handshake_timeout: float = 60.0) -> None:
        super().__init__(config)
        self.tls_handshake_timeout = tls_handshake_timeout

    # -- hooks for subclasses -----------------------------------------------------------------

    def on_started(self) -> None:
        """Accepting connections now."""

    async def before_shutdown(self, sockets: list[socket.socket]) -> None:
        """Called with the served sockets when the server stops, before uvicorn's shutdown."""

    def on_signal(self, sig: int) -> bool:
        """A SIGTERM / SIGINT: True when handled here, False to let uvicorn handle it (exit now)."""
        return False

    # -- what the hooks may use -----------------------------------------------------------------

    def open_connections(self) -> int:
        return len(self.server_state.connections)

    def close_listeners(self) -> None:
        """Stop accepting (each listening server uvicorn started; uvloop's own copies too)."""
        for server in self.servers:
            server.close()

    def request_exit(self) -> None:
        """Ask the serving loop to stop (thread-safe: uvicorn polls the flag)."""
        self.should_exit = True

    # -- uvicorn's internals, overridden --------------------------------------------------------

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        if self.config.ssl is not None:
            # uvicorn has no setting for the TLS handshake's time limit (asyncio's default is 60 s),
            # and a connection counts against --max-connections only once its handshake is done:
            # its create_server calls get one, for this startup only.
            loop.create_server = functools.partial(  # type: ignore[method-assign]
                loop.create_server, ssl_handshake_timeout=self.tls_handshake_timeout
            )
        try:
            await super().startup(sockets)
        finally:
            loop.__dict__.pop("create_server", None)
        if self.started:
            self.on_started()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.before_shutdown(list(sockets or ()))
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.on_signal(sig):
            super().handle_exit(sig, frame)
