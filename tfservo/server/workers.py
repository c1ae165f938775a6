"""`tfservo serve`'s supervisor (one worker by default, `--workers N`), and each worker's link to it.

Every worker is a fresh (spawned) process that runs the single-process serve path on the
listening socket it inherits, so 1 and N workers stop the same way (`shutdown.py`). The
supervisor forwards SIGTERM/SIGINT, lets the workers stop listening only once every one of
them has drained (a handler in one worker may call back into another through the shared
ports), replaces a worker that dies, and stops the server with a worker's error when one
fails to start. The supervisor holds the listening sockets — one per worker on the same port
(`listener.bind_sockets`). A lone worker's replacement serves the same socket, so the new
connections that come while it starts wait in its backlog instead of being refused. Where
several workers have a socket each, a dead worker's socket is closed and its replacement gets
a new one that listens only once it serves: meanwhile the kernel gives every new connection to
the workers alive (the connections queued on the dead one's socket are reset with it).

A worker that asks to be replaced (recycling.py: memory, request quota, a stuck call) keeps
serving until its replacement is ready; then the supervisor tells it to retire: it takes no
new connections, answers what its open connections send with `Connection: close`, and exits
once they are done. The supervisor counts replacements by reason and tells every worker, so
each worker's /metrics reports them (a worker that died cannot count itself).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType

from tfservo.auth.doors import log_access
from tfservo.auth.replay import REPLAY_TABLE, create_replay_table
from tfservo.auth.throttle import THROTTLE_TABLE, create_throttle_table
from tfservo.core import environment
from tfservo.core.errors import ServingError
from tfservo.core.scratch import remove_scratch_dirs
from tfservo.core.settings import Settings
from tfservo.server.listener import bind_socket, grpc_port_settings
from tfservo.server.registry import register_server, unregister
from tfservo.service.decode_budget import BUDGET_TABLE, create_budget_table
from tfservo.service.metrics import MULTIPROC_ENV, mark_worker_dead
from tfservo.service.shared_memory import REGIONS_TABLE, create_regions_table
from tfservo.service.variants import WEIGHTS_TABLE, create_weights_table

__all__ = ["Supervisor", "WorkerLink", "WorkerTarget"]

log = logging.getLogger("tfservo.server")

_SPAWN = multiprocessing.get_context("spawn")  # no fork after TensorFlow has started threads
# Worker → supervisor: _READY, _DRAINED, (_FAILED, message) or (_RECYCLE, reason, why): replace me.
# Supervisor → worker: _STOP (all drained: close the listeners), _RETIRE (your replacement is
# ready) or (_COUNTS, {reason: replacements so far}).
_READY, _DRAINED, _FAILED, _STOP, _RECYCLE = "ready", "drained", "failed", "stop", "recycle"
_RETIRE, _COUNTS = "retire", "counts"
PIDS = "{pids}"  # where the supervisor writes its workers' pids into a worker's serving line
_RETIRE_KILL_SECONDS = 120.0  # a retiring worker still alive after this is killed

WorkerTarget = Callable[[Settings, socket.socket, "WorkerLink"], None]


class WorkerLink:
    """A worker's end of its pipe to the supervisor."""

    def __init__(
        self, conn: Connection, replacements: dict[str, int] | None = None, shared_dir: str | None = None,
    ) -> None:
        self._conn = conn
        self.shared_dir = shared_dir  # the tables every worker shares (throttle, seen signatures)
        self._go = threading.Event()
        self.is_ready = False
        self.recycled = False  # the supervisor is replacing this worker
        self.replacements: dict[str, int] = dict(replacements or {})  # the supervisor's counts, by reason
        self.on_retire: Callable[[], None] = lambda: None  # the replacement is ready: stop serving

    def ready(self, line: str) -> None:
        """Serving: tell the supervisor (with the serving line it logs for the server, PIDS in it
        left for the workers' pids), then follow it (its go-ahead to stop, or its death)."""
        self.is_ready = True
        self._conn.send((_READY, line))
        threading.Thread(target=self._follow, name="tfservo-supervisor-link", daemon=True).start()

    def recycle(self, reason: str, why: str) -> None:
        """Ask the supervisor for a replacement; once it is ready, on_retire is called."""
        self.recycled = True
        log.warning("worker %d asks to be replaced: %s", os.getpid(), why)
        try:
            self._conn.send((_RECYCLE, reason, why))
        except OSError:
            pass

    def wait_for_peers(self, timeout: float) -> None:
        """This worker has drained; wait until every worker has before closing the listeners."""
        try:
            self._conn.send(_DRAINED)
        except OSError:
            return  # the supervisor is gone: nobody else to wait for
        if self._go.wait(timeout):
            log.debug("all workers drained: closing listeners")  # the supervisor says it once
        else:
            log.warning("other workers still busy after %gs: closing listeners anyway", timeout)

    def _follow(self) -> None:
        try:
            while (message := self._conn.recv()) != _STOP:
                if message == _RETIRE:
                    self.on_retire()
                elif isinstance(message, tuple) and message[0] == _COUNTS:
                    self.replacements = message[1]
        except (EOFError, OSError):
            # The supervisor died (SIGKILL, OOM): stop gracefully rather than serve as an orphan.
            # Our stderr went through its TF log filter (logs.py) and is a broken pipe now; a
            # log line written there would abort the interpreter at exit.
            devnull = os.open(os.devnull, os.O_WRONLY)
            for stream in {2, sys.stderr.fileno()}:
                os.dup2(devnull, stream)
            os.kill(os.getpid(), signal.SIGTERM)
        self._go.set()


def _leave(code: int) -> None:
    """Exit now, the log lines written so far flushed and the worker's scratch directories
    (its bundle extractions) removed, since os._exit runs no atexit handler. Handlers are
    flushed, not shut down: another thread may still log a line before the exit, and a closed
    handler would print "--- Logging error ---" instead."""
    remove_scratch_dirs()
    for handler in logging.getLogger().handlers:
        handler.flush()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _worker_main(
    target: WorkerTarget, settings: Settings, sock: socket.socket, conn: Connection, replacements: dict[str, int],
    shared_dir: str | None,
) -> None:
    """Entry point of a spawned worker: serve, or report why it could not start."""
    from tfservo.core.logs import quiet_tensorflow, setup_logging

    quiet_tensorflow()
    setup_logging(settings.log_level, settings.log_format, settings.access_log)
    link = WorkerLink(conn, replacements, shared_dir)
    try:
        target(settings, sock, link)
        # Everything is closed and flushed now. A thread still stuck in a handler or a model call
        # would hold the interpreter's exit forever (it joins executor threads), leaving this
        # worker behind its supervisor: leave without waiting for it.
        _leave(0)
    except KeyboardInterrupt:  # Ctrl-C reaches every worker of the terminal's process group
        _leave(130)  # closed and flushed by then too (serve_process's finally)
    except Exception as exc:
        if link.is_ready:
            raise
        if isinstance(exc, ServingError):
            message = exc.message
        else:  # not an error we foresaw: the traceback helps
            log.exception("worker failed to start")
            message = f"{type(exc).__name__}: {exc}"
        conn.send((_FAILED, message))
        sys.exit(1)


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    slot: int  # which of the supervisor's listening sockets it serves
    ready: bool = False
    drained: bool = False
    connected: bool = True
    recycling: bool = False  # a replacement was started for it
    retire_by: float | None = None  # told to retire (its replacement is ready); killed if alive past this


class Supervisor:
    """Keeps settings.workers processes serving until SIGTERM/SIGINT, then stops them: worker `i`
    (and each replacement of it) on `socks[i]`, or every worker on `socks[0]` when there is one."""

    def __init__(self, target: WorkerTarget, settings: Settings, socks: list[socket.socket]) -> None:
        # Every worker binds the same gRPC port with SO_REUSEPORT, which another server of this
        # user could share silently: the port must be free now.
        settings = grpc_port_settings(settings)
        self.target = target
        self.settings = settings
        self.socks = socks
        self.workers: list[_Worker] = []
        self.stopping = False
        self.released = False  # the workers got the go-ahead to close their listeners
        self.error: str | None = None  # why a worker failed to start
        self.failures: list[str] = []  # serving workers that did not exit 0
        self.replacements: dict[str, int] = {}  # workers replaced so far, by reason
        self.state_dir = ""  # what several workers share (the throttle's table), made by run()
        self.announced = False  # the server's serving line was logged (every first worker serves)
        self.registered: str | None = None  # its entry for `tfservo invoke` (server.registry)

    def run(self) -> None:
        """Start the workers and supervise them; raises ServingError if one failed to start."""
        own_metrics_dir = None
        if self.settings.workers > 1 and not environment.variable(MULTIPROC_ENV):
            own_metrics_dir = tempfile.mkdtemp(prefix="tfservo-metrics-")
            environment.export({MULTIPROC_ENV: own_metrics_dir})  # for the workers' prometheus_client
        # Per-server promises held across the workers: failed authentications count once per
        # server (one worker keeps its own table, and its TMPDIR clean).
        if self.settings.workers > 1:
            self.state_dir = tempfile.mkdtemp(prefix="tfservo-server-")
            create_throttle_table(os.path.join(self.state_dir, THROTTLE_TABLE))
            create_budget_table(os.path.join(self.state_dir, BUDGET_TABLE))
            create_regions_table(os.path.join(self.state_dir, REGIONS_TABLE))
            if self.settings.sigv4_replay_window > 0:
                create_replay_table(os.path.join(self.state_dir, REPLAY_TABLE))
            if self.settings.variants_file:  # weights changed by one worker hold for all
                create_weights_table(os.path.join(self.state_dir, WEIGHTS_TABLE))
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        host, port = self.socks[0].getsockname()[:2]
        log.info("starting %d worker%s on %s:%d", self.settings.workers, "s" if self.settings.workers > 1 else "",
                 host, port)
        log_access(self.settings)  # once for the server, not once per worker
        try:
            for slot in range(self.settings.workers):
                self._start(slot)
            while self.workers:
                wait([w.conn for w in self.workers if w.connected] + [w.process.sentinel for w in self.workers], 1.0)
                for worker in list(self.workers):
                    self._poll(worker)
                    self._kill_if_overdue(worker)
                if self.stopping and not self.released and all(w.drained for w in self.workers if w.ready):
                    self._release()
        finally:
            if self.registered:
                unregister(self.registered)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if own_metrics_dir:
                shutil.rmtree(own_metrics_dir, ignore_errors=True)
            if self.state_dir:
                shutil.rmtree(self.state_dir, ignore_errors=True)
        if self.error:
            raise ServingError(self.error)
        if self.failures:
            raise ServingError("workers did not stop cleanly: " + "; ".join(self.failures) + "; see the log above")
        log.info("stopped")

    def _start(self, slot: int, *, new_socket: bool = False) -> None:
        """Start a worker on socket `slot`; `new_socket`: on a new one in its place, which
        listens only once the worker serves (see the module's docstring)."""
        if new_socket and len(self.socks) > 1:
            old = self.socks[slot]
            host, port = old.getsockname()[:2]
            old.close()  # out of the port's group: the kernel gives its share to the others
            try:
                self.socks[slot] = bind_socket(host, port, shared_port=True, listen=False)
            except OSError as exc:
                self.error = self.error or (
                    f"cannot bind {host}:{port} again for a replacement worker ({exc}); another process "
                    "took the port? Stop it and start tfservo again"
                )
                log.error("%s; stopping the server", self.error)
                self._stop_all()
                return
        parent_conn, child_conn = _SPAWN.Pipe()
        sock = self.socks[slot % len(self.socks)]
        process = _SPAWN.Process(
            target=_worker_main,
            args=(self.target, self.settings, sock, child_conn, self.replacements,
                  self.state_dir or None),
            name="tfservo-worker",
        )
        process.start()
        child_conn.close()  # the worker's end lives in the worker only, so its death reads as EOF here
        self.workers.append(_Worker(process, parent_conn, slot))
        if self.stopping:  # a signal came while this one was starting
            self._signal_all(signal.SIGTERM)

    def _poll(self, worker: _Worker) -> None:
        try:
            while worker.connected and worker.conn.poll():
                message = worker.conn.recv()
                if isinstance(message, tuple) and message[0] == _READY:
                    worker.ready = True
                    self._announce(worker, message[1])
                    self._retire_replaced()
                elif message == _DRAINED:
                    worker.drained = True
                    if worker.recycling:
                        worker.conn.send(_STOP)
                elif isinstance(message, tuple) and message[0] == _RECYCLE:
                    self._recycle(worker, message[1], message[2])
                elif isinstance(message, tuple) and message[0] == _FAILED:
                    self.error = self.error or message[1]
        except (EOFError, OSError):
            worker.connected = False
        if worker.process.exitcode is not None:
            self._exited(worker)

    def _recycle(self, worker: _Worker, reason: str, why: str) -> None:
        """Start a replacement for `worker`; it retires once the replacement is ready."""
        if worker.recycling or self.stopping:
            return
        worker.recycling = True
        log.warning("worker %d is replaced: %s", worker.process.pid, why)
        self._count(reason)
        self._start(worker.slot)

    def _announce(self, worker: _Worker, line: str) -> None:
        """One serving line for the server, once every first worker serves; after it, a line
        for each replacement."""
        if self.announced:
            log.info("%s", line.replace(PIDS, f"replacement pid {worker.process.pid}"))
            return
        if all(w.ready for w in self.workers) and len(self.workers) >= self.settings.workers:
            self.announced = True
            pids = [str(w.process.pid) for w in self.workers]
            log.info("%s", line.replace(PIDS, f"pid{'s' if len(pids) > 1 else ''} {', '.join(pids)}"))
            self.registered = register_server(self.settings, self.socks[0].getsockname()[1])

    def _retire_replaced(self) -> None:
        """A worker is ready: those waiting for a replacement retire."""
        for worker in self.workers:
            if worker.recycling and worker.retire_by is None:
                worker.retire_by = time.monotonic() + _RETIRE_KILL_SECONDS
                self._send(worker, _RETIRE)

    def _kill_if_overdue(self, worker: _Worker) -> None:
        if worker.retire_by is not None and time.monotonic() > worker.retire_by and worker.process.pid:
            log.warning("worker %d did not stop within %g s of its replacement; killing it",
                        worker.process.pid, _RETIRE_KILL_SECONDS)
            worker.retire_by = float("inf")
            try:
                os.kill(worker.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _count(self, reason: str) -> None:
        """One more replacement for `reason`: every worker's /metrics hears of it."""
        self.replacements = {**self.replacements, reason: self.replacements.get(reason, 0) + 1}
        for worker in self.workers:
            self._send(worker, (_COUNTS, self.replacements))

    @staticmethod
    def _send(worker: _Worker, message: object) -> None:
        try:
            worker.conn.send(message)
        except OSError:
            pass

    def _exited(self, worker: _Worker) -> None:
        self.workers.remove(worker)
        worker.conn.close()
        pid, how = worker.process.pid or 0, _describe(worker.process.exitcode)
        mark_worker_dead(pid)  # drop its live gauges from every worker's /metrics
        if not worker.ready:
            if not self.stopping:
                self.error = self.error or f"worker {pid} {how} before it was serving; see the log above"
                log.error("worker %d failed to start (%s); stopping the server", pid, how)
                self._stop_all()
        elif worker.recycling:
            log.info("worker %d %s after it was replaced", pid, how)
        elif self.stopping:
            if worker.process.exitcode != 0:
                self.failures.append(f"worker {pid} {how}")
        else:
            log.warning("worker %d %s; starting a new one", pid, how)
            self._count("died")
            self._start(worker.slot, new_socket=True)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if not self.stopping:
            log.info("%s received: stopping %d workers once their requests in flight are done",
                     signal.Signals(sig).name, len(self.workers))
            self._stop_all()
        elif sig == signal.SIGINT:  # a second Ctrl-C: workers stop without waiting (as one process does)
            self._signal_all(signal.SIGINT)

    def _stop_all(self) -> None:
        self.stopping = True
        self._signal_all(signal.SIGTERM)

    def _signal_all(self, sig: int) -> None:
        for worker in self.workers:
            if worker.process.pid is None:
                continue
            try:
                os.kill(worker.process.pid, sig)
            except ProcessLookupError:
                pass

    def _release(self) -> None:
        """Every serving worker has drained: none can call back any more, so all may stop."""
        self.released = True
        log.info("all workers drained: closing listeners")
        for worker in self.workers:
            self._send(worker, _STOP)


def _describe(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


