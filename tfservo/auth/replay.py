"""--sigv4-replay-window: a signature the runtime API accepted once is refused if it comes
again within the window (AWS itself accepts a replay for the 5 minutes a signature is current).

Seen signatures live in a SharedTable, in the file the supervisor makes for the workers of one
server (`create_replay_table`), so a replay is refused whichever worker it reaches. The table
is bounded: past `max_signatures` seen within the window the oldest gives its place first.
"""

from __future__ import annotations

import struct
import time

from tfservo.core.shared_table import SharedTable, create_table

__all__ = ["REPLAY_TABLE", "ReplayCache", "create_replay_table"]

REPLAY_TABLE = "sigv4-replay"  # its file's name in the server's shared folder
_RECORD = struct.Struct("<d")  # when it was first seen (monotonic seconds)
MAX_SIGNATURES = 100_000


def create_replay_table(path: str, max_signatures: int = MAX_SIGNATURES) -> None:
    """The file the workers of one server share seen signatures through."""
    create_table(path, max_signatures, _RECORD)


class ReplayCache:
    """Signatures seen within the last `window` seconds."""

    def __init__(self, window: float, path: str | None = None, max_signatures: int = MAX_SIGNATURES) -> None:
        self.window = window
        self._table = SharedTable(max_signatures, _RECORD, path)

    def first_use(self, signature: str) -> bool:
        """True the first time `signature` is seen within the window (it is remembered), False for a replay."""
        now = time.monotonic()
        with self._table.locked():
            seen = self._table.get(signature)
            if seen is not None and now - float(seen[0]) < self.window:  # type: ignore[arg-type]
                return False
            self._table.put(signature, (now,), evictable=lambda record: float(record[0]))  # type: ignore[arg-type]
            return True

    def close(self) -> None:
        self._table.close()
