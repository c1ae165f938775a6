"""Close a listening socket without resetting connections the kernel has already taken.

The kernel completes TCP handshakes on its own and queues the connections until the server
accepts them; closing the listener resets every one still queued. Under load that is dozens
of clients. So a stop first makes the socket drop new SYNs (a classic BPF socket filter,
Linux only), lets the event loop accept what is queued, and only then closes: clients whose
connection was taken get an answer, later ones retry their SYN and find the port closed.
"""

from __future__ import annotations

import asyncio
import ctypes
import socket
import struct
import sys
import time

__all__ = ["queued_connections", "refuse_new_connections", "wait_accepted"]

_SO_ATTACH_FILTER = 26
# Classic BPF over the TCP header: drop a segment whose flags are SYN without ACK (a new
# connection); accept everything else, so handshakes under way still complete.
_DROP_SYN = (
    (0x30, 0, 0, 13),  # ldb [13]           the flags byte
    (0x54, 0, 0, 0x12),  # and #(SYN|ACK)
    (0x15, 0, 1, 0x02),  # jeq #SYN, drop, accept
    (0x06, 0, 0, 0),  # ret #0            drop
    (0x06, 0, 0, 0xFFFFFFFF),  # ret #-1           accept
)


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
