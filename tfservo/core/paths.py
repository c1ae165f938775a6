"""Whether a path lies inside a root: the one confinement check (multi-model loads, the scan)."""

from __future__ import annotations

import os

__all__ = ["within"]


def within(path: str, root: str) -> bool:
    """`path` is `root` or below it; both already resolved (os.path.realpath), so a link or
    `..` cannot lead out."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
