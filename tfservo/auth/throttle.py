"""Peers that keep failing to authenticate are made to wait, so keys cannot be guessed at line
speed; everyone else is served as before.

After `limit` failures a peer's requests are refused for `penalty` seconds (429 with
Retry-After over HTTP, RESOURCE_EXHAUSTED over gRPC) before any key is looked at; each further
failure once the wait is over doubles it, up to `max_penalty`, and the wait stays there while
failures go on. A peer is forgiven only after `window` quiet seconds past its last failure and
its wait; a success does not clear it, so a holder of one valid key cannot interleave it to
reset the count (with the defaults, at most ~15 wrong keys a minute, then one a minute).

One throttle serves every door of a server, and with a table path (`create_throttle_table`,
made by the supervisor) every worker process of it: failures count once per server, whatever
door or worker saw them. The table is bounded (the peer whose last failure is oldest gives its
place first).
"""

from __future__ import annotations

import struct
import time

from tfservo.core.shared_table import SharedTable, create_table

__all__ = ["THROTTLE_TABLE", "FailureThrottle", "create_throttle_table"]

THROTTLE_TABLE = "throttle"  # its file's name in the server's shared folder

_RECORD = struct.Struct("<Iddd")  # failures, last failure, held until, penalty (monotonic seconds)
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
        """One more failed authentication from `peer`."""
        now = time.monotonic()
        with self._table.locked():
            state = self._table.get(peer)
            failures, last, until, penalty = state if state is not None else (0, now, 0.0, 0.0)
            assert isinstance(failures, int) and isinstance(last, float)
            assert isinstance(until, float) and isinstance(penalty, float)
            if now - max(last, until) > self.window:
                failures, until, penalty = 0, 0.0, 0.0  # quiet for a whole window: forgiven
            failures += 1
            if failures >= self.limit and now >= until:
                penalty = min(self.max_penalty, penalty * 2 if penalty else self.penalty)
                until = now + penalty
            self._table.put(peer, (failures, now, until, penalty), evictable=lambda record: float(record[1]))  # type: ignore[arg-type]

    def counts(self) -> tuple[int, int]:
        """(peers with failures counted now, peers made to wait now): for the metrics."""
        now = time.monotonic()
        counted = held = 0
        for _, last, until, _ in self._table.records():
            assert isinstance(last, float) and isinstance(until, float)
            if now - max(last, until) <= self.window:
                counted += 1
                held += until > now
        return counted, held

    def close(self) -> None:
        self._table.close()
