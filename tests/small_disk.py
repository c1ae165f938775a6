"""A small disk for the tests of what happens when one fills: a tmpfs of a given size mounted
on a folder (which needs the mount privilege CI's container has), grown or shrunk in place."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """`path` as a tmpfs of `size` (e.g. "256k") for the block; skipped where mounts are refused."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def resize(path: Path, size: str) -> None:
    """Give the small disk at `path` another size, its files kept (space returns)."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)
