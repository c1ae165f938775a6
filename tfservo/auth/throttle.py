"""Peers that keep failing to authenticate are made to wait, so keys cannot be guessed at line
speed; everyone else is served as before.

After `limit` failures within `window` seconds a peer's requests are refused for `penalty`
seconds (429 with Retry-After over HTTP, RESOURCE_EXHAUSTED over gRPC) before any key is
looked at; each further failure while it is held doubles the wait, up to `max_penalty`. A
success clears the peer. Peers are kept in a bounded table (the oldest forgotten first).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["FailureThrottle"]


@dataclass
class _Peer:
    failures: int = 0
    first: float = 0.0
    until: float = 0.0  # held until (monotonic seconds)
    penalty: float = 0.0


class FailureThrottle:
    """Failed authentications per peer address, and how long a peer must wait."""

    def __init__(
        self, limit: int = 10, window: float = 60.0, penalty: float = 1.0, max_penalty: float = 60.0,
        max_peers: int = 10_000,
    ) -> None:
        self.limit, self.window, self.penalty, self.max_penalty = limit, window, penalty, max_penalty
        self.max_peers = max_peers
        self._peers: OrderedDict[str, _Peer] = OrderedDict()
        self._lock = threading.Lock()

    def held(self, peer: str) -> float:
        """Seconds `peer` must still wait (0: go ahead)."""
        with self._lock:
            state = self._peers.get(peer)
            return max(0.0, state.until - time.monotonic()) if state is not None else 0.0

    def failed(self, peer: str) -> None:
        now = time.monotonic()
        with self._lock:
            state = self._peers.get(peer)
            if state is None or (now - state.first > self.window and now >= state.until):
                state = _Peer(first=now)
                self._peers[peer] = state
                if len(self._peers) > self.max_peers:
                    self._peers.popitem(last=False)
            self._peers.move_to_end(peer)
            state.failures += 1
            if state.failures >= self.limit:
                state.penalty = min(self.max_penalty, state.penalty * 2 if state.penalty else self.penalty)
                state.until = now + state.penalty

    def succeeded(self, peer: str) -> None:
        with self._lock:
            self._peers.pop(peer, None)
