"""Facts about other processes."""

from __future__ import annotations

import os

__all__ = ["identity_alive", "process_alive", "process_identity"]


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_identity(pid: int | None = None) -> str:
    """"PID:START": a process named so that a later one given the same pid is not taken for it
    (START is its start time in clock ticks since boot, from /proc; 0 where there is none)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_ticks(pid)}"


def identity_alive(identity: str) -> bool:
    """Whether the process `process_identity` named is still running (on this machine)."""
    pid_text, _, start = identity.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    return process_alive(pid) and (start in ("", "0") or _start_ticks(pid) == int(start))


def _start_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    # the command name (field 2) may hold spaces and parentheses: count fields after its last ')'
    return int(stat[stat.rindex(b")") + 2:].split()[19])
