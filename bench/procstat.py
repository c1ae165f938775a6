"""CPU time of a process tree and of the whole machine, read from /proc (Linux)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user+system CPU seconds) of one process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def tree_cpu_seconds(root: int, command: bytes | None = None) -> float:
    """CPU seconds used so far by `root` and every live descendant (only those whose command
    line holds `command`, when given)."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                stats[int(name)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats and (command is None or command in _command_line(pid)):
            total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


def _command_line(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def machine_busy_seconds() -> float:
    """CPU seconds all cores have spent not idle since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / _TICK


@dataclass
class CpuSample:
    wall: float
    server: float
    machine: float

    @classmethod
    def take(cls, server_pid: int) -> CpuSample:
        return cls(time.monotonic(), tree_cpu_seconds(server_pid), machine_busy_seconds())


def cpu_use(before: CpuSample, after: CpuSample) -> dict[str, float]:
    """Cores used on average between two samples: by the server tree and by the whole machine."""
    wall = max(after.wall - before.wall, 1e-9)
    return {
        "server_cores": round((after.server - before.server) / wall, 3),
        "machine_cores": round((after.machine - before.machine) / wall, 3),
    }
