"""Memory: what the container (its cgroup) or the machine has, and what a process uses, read
from /proc and /sys (Linux; None or 0 where unknown)."""

from __future__ import annotations

import os

__all__ = ["available_memory_bytes", "memory_limit_bytes", "resident_bytes"]

_CGROUP_FILES = (  # (limit, usage): cgroup v2, then v1
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def available_memory_bytes() -> int | None:
    """Memory a new model can use: MemAvailable, capped by the cgroup's limit minus its usage."""
    try:
        import psutil  # optional: more portable when installed

        available: int | None = int(psutil.virtual_memory().available)
    except ImportError:
        available = _meminfo_available()
    cgroup = _cgroup_headroom()
    if cgroup is not None:
        available = cgroup if available is None else min(available, cgroup)
    return available


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom() -> int | None:
    """limit − usage of this process's memory cgroup (v2, else v1); None when unlimited."""
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 2**60:
            return None
        return max(int(limit) - usage, 0)
    return None


def memory_limit_bytes() -> int | None:
    """The memory this process may use in all: its cgroup's limit if one is set, else the machine's."""
    for limit_file, _ in _CGROUP_FILES:
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit() and int(limit) < 2**60:
            return int(limit)
        break
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def resident_bytes(pid: int | None = None) -> int:
    """Resident set size of process `pid` (this one by default); 0 where unknown."""
    try:
        with open(f"/proc/{pid or 'self'}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0
