"""Listening sockets: bound for one worker or one per worker, and closed without resetting
connections the kernel has already taken.

Several workers listen on one port through a socket each (SO_REUSEPORT), so the kernel spreads
new connections among them by their addresses. One socket shared by every worker let whichever
woke first accept a whole burst: 4 runs in 6 put all 32 of a load generator's connections on
one of two workers.

The kernel completes TCP handshakes on its own and queues the connections until the server
accepts them; closing the listener resets every one still queued. Under load that is dozens
of clients. So a stop first makes the socket drop new SYNs (a classic BPF socket filter,
Linux only), lets the event loop accept what is queued, and only then closes: clients whose
connection was taken get an answer, later ones retry their SYN and find the port closed.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import socket
import struct
import sys
import time

from tfservo.core.errors import ServingError
from tfservo.core.settings import Settings

__all__ = ["bind_socket", "bind_sockets", "free_port", "grpc_port_settings", "port_free", "queued_connections",
           "refuse_new_connections", "wait_accepted"]

log = logging.getLogger("tfservo.server")

_SO_ATTACH_FILTER = 26
_BACKLOG = 2048
# Classic BPF over the TCP header: drop a segment whose flags are SYN without ACK (a new
# connection); accept everything else, so handshakes under way still complete.
_DROP_SYN = (
    (0x30, 0, 0, 13),  # ldb [13]           the flags byte
    (0x54, 0, 0, 0x12),  # and #(SYN|ACK)
    (0x15, 0, 1, 0x02),  # jeq #SYN, drop, accept
    (0x06, 0, 0, 0),  # ret #0            drop
    (0x06, 0, 0, 0xFFFFFFFF),  # ret #-1           accept
)


def bind_socket(host: str, port: int, *, shared_port: bool = False, listen: bool = True) -> socket.socket:
    """A listening TCP socket (port 0 picks a free one), inherited by spawned workers;
    `shared_port`: one of several on the port (SO_REUSEPORT). Without `listen` it is only bound:
    the kernel gives it no connection until its server listens (asyncio does, once serving)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(_BACKLOG)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def bind_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening sockets on one port, one per worker (see the module's docstring); one
    plain socket when `count` is 1. A port another process listens on fails as `bind` does,
    even one with SO_REUSEPORT of its own, which would otherwise share it silently."""
    if count <= 1 or not sys.platform.startswith("linux"):  # elsewhere SO_REUSEPORT does not spread connections
        return [bind_socket(host, port)]
    if port and not port_free(host, port):
        raise OSError(errno.EADDRINUSE, f"address {host}:{port} already in use")
    first = bind_socket(host, port, shared_port=True)
    socks = [first]
    try:
        socks += [bind_socket(host, first.getsockname()[1], shared_port=True) for _ in range(count - 1)]
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def grpc_port_settings(settings: Settings) -> Settings:
    """The settings with the gRPC port this server will take: 0 becomes a free port now; the
    default port (9000, never chosen by the user) becomes a free one when another process holds
    it, with a line saying so; a port the user chose and another holds is a ServingError."""
    host = settings.grpc_host or settings.host
    if settings.grpc_port is None:
        return settings
    if settings.grpc_port == 0:
        return settings.replace(grpc_port=free_port(host))
    if port_free(host, settings.grpc_port):
        return settings
    if not settings.grpc_port_given:
        port = free_port(host)
        log.warning("gRPC's default port %s:%d is taken (another server?); serving gRPC on %d instead "
                    "(--grpc-port chooses one)", host, settings.grpc_port, port)
        return settings.replace(grpc_port=port)
    raise ServingError(f"cannot listen for gRPC on {host}:{settings.grpc_port} (port in use?); pick another --grpc-port")


def free_port(host: str) -> int:
    """A port nothing listens on now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def port_free(host: str, port: int) -> bool:
    """Whether nothing listens on `host:port` now (a check before binding with SO_REUSEPORT)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def refuse_new_connections(sock: socket.socket) -> bool:
    """Make the listening `sock` ignore new connection attempts; False where unsupported."""
    if not sys.platform.startswith("linux") or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    program = (ctypes.c_uint64 * len(_DROP_SYN))(
        *(struct.unpack("Q", struct.pack("HBBI", *insn))[0] for insn in _DROP_SYN)
    )
    fprog = struct.pack("HL", len(_DROP_SYN), ctypes.addressof(program))
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
    except OSError:
        return False
    return True


def queued_connections(sock: socket.socket) -> int:
    """How many handshaken connections wait in `sock`'s accept queue (0 where unknown)."""
    try:
        # For a listening socket, struct tcp_info's tcpi_unacked is the accept queue length.
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except (OSError, AttributeError):
        return 0
    unacked: int = struct.unpack_from("I", info, 24)[0]
    return unacked


async def wait_accepted(socks: list[socket.socket], timeout: float) -> None:
    """Until the event loop has accepted every queued connection on `socks`, or `timeout`."""
    deadline = time.monotonic() + timeout
    while any(queued_connections(s) for s in socks) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.01)  # a handshake whose SYN-ACK was already out completes meanwhile
