"""Peers that keep failing to authenticate are made to wait, so keys cannot be guessed at line
speed; everyone else is served as before.

After `limit` failures within `window` seconds a peer's requests are refused for `penalty`
seconds (429 with Retry-After over HTTP, RESOURCE_EXHAUSTED over gRPC) before any key is
looked at; each further failure while it is held doubles the wait, up to `max_penalty`. A
success clears the peer. One throttle serves every door of a server, and with a table path
(`create_throttle_table`, made by the supervisor) every worker process of it: failures count
once per server, whatever door or worker saw them. The table is bounded (the peer whose
failures began longest ago gives its place first).
"""

from __future__ import annotations

import struct
import time

from tfservo.core.shared_table import SharedTable, create_table

__all__ = ["FailureThrottle", "create_throttle_table"]

_RECORD = struct.Struct("<Iddd")  # failures, first failure, held until, penalty (monotonic seconds)
MAX_PEERS = 10_000


def create_throttle_table(path: str, max_peers: int = MAX_PEERS) -> None:
    """The file the workers of one server share their throttle through."""
    create_table(path, max_peers, _RECORD)


class FailureThrottle:
    """Failed authentications per peer address, and how long a peer must wait."""

    def __init__(
        self, limit: int = 10, window: float = 60.0, penalty: float = 1.0, max_penalty: float = 60.0,
        max_peers: int = MAX_PEERS, path: str | None = None,
    ) -> None:
        self.limit, self.window, self.penalty, self.max_penalty = limit, window, penalty, max_penalty
        self._table = SharedTable(max_peers, _RECORD, path)

    def held(self, peer: str) -> float:
        """Seconds `peer` must still wait (0: go ahead). A glance, without the lock: every request
        asks, and a failure recorded by another worker at this very moment is seen by the next."""
        state = self._table.get(peer)
        if state is None:
            return 0.0
        until = state[2]
        assert isinstance(until, float)
        return max(0.0, until - time.monotonic())

    def failed(self, peer: str) -> None:
        now = time.monotonic()
        with self._table.locked():
            state = self._table.get(peer)
            failures, first, until, penalty = state if state is not None else (0, now, 0.0, 0.0)
            assert isinstance(failures, int) and isinstance(first, float)
            assert isinstance(until, float) and isinstance(penalty, float)
            if now - first > self.window and now >= until:
                failures, first, until, penalty = 0, now, 0.0, 0.0  # a new window
            failures += 1
            if failures >= self.limit:
                penalty = min(self.max_penalty, penalty * 2 if penalty else self.penalty)
                until = now + penalty
            self._table.put(peer, (failures, first, until, penalty), evictable=lambda record: float(record[1]))  # type: ignore[arg-type]

    def succeeded(self, peer: str) -> None:
        if self._table.get(peer) is None:  # the common case: nothing to clear, no lock taken
            return
        with self._table.locked():
            self._table.delete(peer)

    def close(self) -> None:
        self._table.close()
