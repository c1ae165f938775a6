"""Background work handed to a child process through a pipe, so its Python never takes the
interpreter's lock from requests.

The serving process keeps each item as plain values; a sender thread pickles what has gathered
into the pipe every `delay` seconds (sooner once `batch` items wait), and past `max_queue`
waiting items new ones are dropped (`add` says so). The child — `python -m tfservo.core.offload`
on one end of a socket pair, at nice 10, ignoring SIGINT and SIGTERM, which its parent handles;
not multiprocessing's spawn, which would run the parent's main script again in the child when
it has no `if __name__ == "__main__"` guard — builds its worker with `make(reply, *args)` and
hands it each batch; `reply(message)` sends a message back, which
the parent's `on_message` gets on a reader thread, and the child's log records are written by
the parent's logging. The child ends when the parent closes it or
dies (end of pipe), so it never outlives its parent. Used by span export (core.trace_export)
and the payload logger (capture.payload_log).
"""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Protocol

from tfservo.core.queues import take_all

__all__ = ["ChildWork", "Offload"]

log = logging.getLogger("tfservo")


class ChildWork(Protocol):
    """What `make` returns in the child."""

    def handle(self, batch: list[Any]) -> None: ...

    def close(self) -> None: ...


class Offload:
    """Items from any thread of this process to a ChildWork in a child process."""

    def __init__(
        self,
        make: Callable[..., ChildWork],
        args: tuple[object, ...],
        *,
        name: str,
        delay: float,
        max_queue: int,
        batch: int,
        on_message: Callable[[Any], None] = lambda message: None,
    ) -> None:
        self.name, self.delay, self.max_queue, self.batch = name, delay, max_queue, batch
        self.on_message = on_message
        self.pending: collections.deque[object] = collections.deque()
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tfservo.core.offload", str(theirs.fileno()), name],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.conn = Connection(ours.detach())
        # the child finds `make` where this process does (a test module, a source tree)
        self.conn.send((list(sys.path), pickle.dumps((make, args)), logging.getLogger("tfservo").getEffectiveLevel()))
        self._send_lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._flushed: dict[int, threading.Event] = {}
        self._wake = threading.Event()
        self._closed = False
        self._gone = False
        threading.Thread(target=self._read_loop, name=f"{name}-read", daemon=True).start()
        threading.Thread(target=self._send_loop, name=f"{name}-send", daemon=True).start()
        atexit.register(self.close)

    def add(self, item: object) -> bool:
        """Hold `item` for the next batch; False when it was dropped (the queue is full, or the
        child has gone)."""
        if self._gone or len(self.pending) >= self.max_queue:
            return False
        self.pending.append(item)
        if len(self.pending) >= self.batch:
            self._wake.set()
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        """Send what is held and wait (up to `timeout` s) until the child has handled it."""
        if self._closed or self._gone:
            return False
        token = next(self._tokens)
        done = self._flushed[token] = threading.Event()
        try:
            self._send()
            self._put(("flush", token))
            return done.wait(timeout) and not self._gone
        except OSError:
            self._went()
            return False
        finally:
            self._flushed.pop(token, None)

    def close(self, timeout: float = 10.0) -> None:
        """Hand over what is held, let the child finish it, and end the child."""
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._wake.set()
        if not self._gone:
            try:
                self._put(("close", None))
            except OSError:
                pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.conn.close()

    def _put(self, message: tuple[str, object]) -> None:
        with self._send_lock:
            self.conn.send(message)

    def _send(self) -> None:
        batch = take_all(self.pending)
        if batch:
            self._put(("items", batch))

    def _send_loop(self) -> None:
        while not self._closed:
            self._wake.wait(self.delay)
            self._wake.clear()
            try:
                self._send()
            except OSError:
                self._went()
                return

    def _read_loop(self) -> None:
        while True:
            try:
                kind, payload = self.conn.recv()
            except (EOFError, OSError):
                if not self._closed:
                    self._went()
                return
            if kind == "flushed":
                event = self._flushed.get(payload)
                if event is not None:
                    event.set()
            elif kind == "log":  # the child's log records, written by this process's logging
                name, level, text = payload
                logging.getLogger(name).log(level, "%s", text)
            else:
                try:
                    self.on_message(payload)
                except Exception:
                    log.exception("%s: a message from the child process failed", self.name)

    def _went(self) -> None:
        if not self._gone and not self._closed:
            log.warning("%s: the child process has gone (exit code %s); its work is dropped from now on",
                        self.name, self.process.poll())
        self._gone = True
        for event in list(self._flushed.values()):
            event.set()


def _child(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(10)  # on a busy machine the requests' processes come first; items wait in the pipe
    conn = Connection(fd)
    path, payload, level = conn.recv()
    sys.path[:] = path
    make, args = pickle.loads(payload)

    sending = threading.Lock()  # the work may reply, and log, from threads of its own

    def reply(message: object) -> None:
        with sending:
            conn.send(("message", message))

    logging.getLogger().handlers[:] = [_ToParent(conn, sending)]
    logging.getLogger().setLevel(logging.WARNING)  # libraries' warnings; tfservo's at the parent's level
    logging.getLogger("tfservo").setLevel(level)

    work = make(reply, *args)
    try:
        while True:
            try:
                kind, payload = conn.recv()
            except (EOFError, OSError):
                break
            if kind == "items":
                try:
                    work.handle(payload)
                except Exception:  # a bug must not end the handling of later items
                    log.exception("handling a batch failed")
            elif kind == "flush":
                with sending:
                    conn.send(("flushed", payload))
            elif kind == "close":
                break
    finally:
        work.close()
        conn.close()
        os._exit(0)  # nothing of the parent's (atexit handlers, the SDK's) runs here


class _ToParent(logging.Handler):
    """The child's log records go to the parent, which writes them in its own format (text or
    JSON, its level and filters), as its own lines would be."""

    def __init__(self, conn: Connection, sending: threading.Lock) -> None:
        super().__init__()
        self.conn, self.sending = conn, sending
        self.setFormatter(logging.Formatter("%(message)s"))  # with the traceback, if any

    def emit(self, record: logging.LogRecord) -> None:
        try:
            with self.sending:
                self.conn.send(("log", (record.name, record.levelno, self.format(record))))
        except (OSError, ValueError):  # the parent has gone: nobody to tell
            pass


if __name__ == "__main__":
    logging.basicConfig(format=f"{sys.argv[2]}: %(message)s")  # until the pipe is set up
    _child(int(sys.argv[1]))
