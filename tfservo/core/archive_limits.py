"""How large an archive may be once extracted: a setting (settings.py) that bundle loading keeps."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ArchiveLimits"]


@dataclass(frozen=True)
class ArchiveLimits:
    """Bounds an archive must keep before anything is extracted (decompression bombs, floods
    of files): member files, bytes once extracted (None: the free space where it extracts), and
    extracted bytes per compressed byte, held only by archives that expand past 64 MiB."""

    max_files: int = 100_000
    max_bytes: int | None = None
    max_ratio: float = 100.0
