"""The durable queue of asynchronous requests: one SQLite file in the state folder, shared by
every worker process of the server (and by the next server started on the same folder).

A request is committed (WAL, synchronous=FULL) before its 202 is sent, so nothing accepted is
lost. A request taken to run is marked with the taking process; when that process is gone
(killed, crashed) the next claim puts it back in the queue, so it runs again after a restart.
Its answer is keyed by its InferenceId, so a second run writes the same object, not another.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass

from tfservo.core.errors import InvalidArgument
from tfservo.core.processes import identity_alive, process_identity

__all__ = ["AsyncQueue", "AsyncRequest", "Submission", "DuplicateInferenceId"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,              -- queued | running | completed | failed | expired
    input TEXT NOT NULL,              -- where the request body is: s3://..., or a local path
    content_type TEXT, accept TEXT, custom_attributes TEXT,
    output TEXT NOT NULL,             -- where its answer goes
    failure TEXT NOT NULL,            -- where its error goes
    received REAL NOT NULL, expires REAL NOT NULL, timeout REAL NOT NULL,
    owner TEXT, started REAL, finished REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    reason TEXT
);
CREATE INDEX IF NOT EXISTS requests_by_state ON requests (state, received);
"""
_FIELDS = ("id", "input", "content_type", "accept", "custom_attributes", "output", "failure",  # AsyncRequest's order
           "state", "received", "expires", "timeout", "owner", "started", "finished", "attempts", "reason")
FINAL_STATES = ("completed", "failed", "expired")


class DuplicateInferenceId(InvalidArgument):
    """An InferenceId already queued for another input."""


@dataclass(frozen=True)
class _Call:
    """What a request runs and where its results go."""

    id: str
    input: str
    content_type: str | None
    accept: str | None
    custom_attributes: str | None
    output: str
    failure: str


@dataclass(frozen=True)
class Submission(_Call):
    """One InvokeEndpointAsync call, checked, with its TTL and time limit in seconds."""

    ttl: float
    timeout: float


@dataclass(frozen=True)
class AsyncRequest(_Call):
    """A stored request and where it stands."""

    state: str
    received: float
    expires: float
    timeout: float
    owner: str | None
    started: float | None
    finished: float | None
    attempts: int
    reason: str | None

    def as_json(self) -> dict[str, object]:
        """For GET /async-invocations/{id}: its state, times and locations."""
        return {
            "InferenceId": self.id, "State": self.state, "InputLocation": self.input,
            "OutputLocation": self.output, "FailureLocation": self.failure, "ReceivedTime": self.received,
            "StartedTime": self.started, "FinishedTime": self.finished, "Attempts": self.attempts,
            "ExpiresTime": self.expires, "FailureReason": self.reason,
        }


class AsyncQueue:
    """The requests of one state folder. Safe to share between threads; processes each open
    their own."""

    def __init__(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.path = os.path.join(folder, "requests.sqlite3")
        self.me = process_identity()
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        # Switching to WAL takes the file's exclusive lock without waiting on the busy timeout, so
        # workers opening the folder at once would see "database is locked": one at a time here.
        with open(self.path + ".open-lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        self._db.execute("PRAGMA synchronous=FULL")  # a 202 is sent only after the request is on disk

    def submit(self, request: Submission, now: float | None = None) -> AsyncRequest:
        """Store a request (committed before this returns). The same InferenceId for the same
        input again (a client's retry) answers the stored one; for another input it is refused."""
        now = time.time() if now is None else now
        with self._lock, self._transaction():
            found = self._get(request.id)
            if found is not None:
                if found.input != request.input:
                    raise DuplicateInferenceId(
                        f"InferenceId {request.id} is already queued for input {found.input}; give each request its own"
                    )
                return found
            self._db.execute(
                "INSERT INTO requests (id, state, input, content_type, accept, custom_attributes, output, failure, "
                "received, expires, timeout) VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (request.id, request.input, request.content_type, request.accept, request.custom_attributes,
                 request.output, request.failure, now, now + request.ttl, request.timeout),
            )
            stored = self._get(request.id)
        assert stored is not None
        return stored

    def claim(self, limit: int, now: float | None = None, skip: Collection[str] = ()) -> AsyncRequest | None:
        """The oldest queued request, now this process's to run, or None when none waits or
        `limit` requests already run (across every process on the folder). Requests of a
        process that is gone are queued again first; those in `skip` wait (this process retries
        them later)."""
        now = time.time() if now is None else now
        with self._lock, self._transaction():
            running = self._db.execute("SELECT id, owner FROM requests WHERE state = 'running'").fetchall()
            orphans = [rid for rid, owner in running if owner != self.me and not identity_alive(owner or "")]
            if orphans:
                self._db.executemany("UPDATE requests SET state = 'queued', owner = NULL WHERE id = ?",
                                     [(rid,) for rid in orphans])
            if len(running) - len(orphans) >= limit:
                return None
            waiting = ",".join("?" * len(skip))
            row = self._db.execute(
                "SELECT id FROM requests WHERE state = 'queued'"
                + (f" AND id NOT IN ({waiting})" if skip else "") + " ORDER BY received LIMIT 1",
                tuple(skip),
            ).fetchone()
            if row is None:
                return None
            self._db.execute(
                "UPDATE requests SET state = 'running', owner = ?, started = ?, attempts = attempts + 1 WHERE id = ?",
                (self.me, now, row[0]),
            )
            return self._get(row[0])

    def finish(self, request_id: str, state: str, reason: str | None = None, now: float | None = None) -> None:
        """Record how a request this process ran ended (`state`: completed, failed or expired)."""
        assert state in FINAL_STATES
        with self._lock, self._transaction():
            self._db.execute(
                "UPDATE requests SET state = ?, finished = ?, reason = ?, owner = NULL WHERE id = ? AND owner = ?",
                (state, time.time() if now is None else now, reason, request_id, self.me),
            )

    def release(self, request_id: str) -> None:
        """Put a request this process took back in the queue (it stops before running it)."""
        with self._lock, self._transaction():
            self._db.execute("UPDATE requests SET state = 'queued', owner = NULL, attempts = attempts - 1 "
                             "WHERE id = ? AND owner = ?", (request_id, self.me))

    def get(self, request_id: str) -> AsyncRequest | None:
        with self._lock:
            return self._get(request_id)

    def counts(self) -> dict[str, int]:
        """Requests by state (every state present, 0 where none)."""
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*) FROM requests GROUP BY state").fetchall()
        found = {"queued": 0, "running": 0, **{state: 0 for state in FINAL_STATES}}
        found.update(dict(rows))
        return found

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _get(self, request_id: str) -> AsyncRequest | None:
        row = self._db.execute(f"SELECT {', '.join(_FIELDS)} FROM requests WHERE id = ?", (request_id,)).fetchone()
        return AsyncRequest(*row) if row is not None else None

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """BEGIN IMMEDIATE … COMMIT (ROLLBACK on error): one writer at a time across processes."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")
