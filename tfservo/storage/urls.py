"""A local path or URL as an fsspec filesystem and path, and back as the URL a user wrote."""

from __future__ import annotations

from typing import Any

from tfservo.core.errors import InvalidArgument

__all__ = ["UnsupportedStorage", "display_url", "is_local", "url_to_fs"]


class UnsupportedStorage(InvalidArgument):
    """A URL whose protocol no installed fsspec backend serves; the message names the URL."""


def url_to_fs(url: str) -> tuple[Any, str]:
    """fsspec filesystem and path for a local path or URL; UnsupportedStorage when no backend fits."""
    import fsspec.core

    try:
        fs_path: tuple[Any, str] = fsspec.core.url_to_fs(url)
        return fs_path
    except (ImportError, ValueError) as exc:
        raise UnsupportedStorage(f"cannot open {url}: {exc}; install the fsspec backend for its protocol") from None


def is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def display_url(fs: Any, path: str) -> str:
    return path if is_local(fs) else fs.unstrip_protocol(path)
