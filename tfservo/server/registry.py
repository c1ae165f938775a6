"""Where the servers running on this machine say what they serve, so that `tfservo invoke PATH`
can send its request to one that already has PATH loaded instead of importing TensorFlow and
loading the model again (seconds) for one answer.

Each `tfservo serve` that answers unauthenticated requests on its HTTP port writes one small JSON
file, `<temporary folder>/tfservo-servers-<uid>/<pid>.json` (the folder 0700), once it serves, and
removes it when it stops; a file whose process is gone is ignored and removed by the next reader.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from tfservo.core.processes import process_alive
from tfservo.core.settings import Settings

__all__ = ["Registered", "register", "register_server", "registered", "unregister"]


@dataclass(frozen=True)
class Registered:
    """One running server: its pid, base URL, the bundle paths it serves (absolute), whether it
    re-imports handler code on change (--reload), and when it started serving (epoch seconds)."""

    pid: int
    url: str
    paths: tuple[str, ...]
    reload: bool
    started: float


def _folder() -> str:
    return os.path.join(tempfile.gettempdir(), f"tfservo-servers-{os.getuid()}")


def register(url: str, paths: tuple[str, ...], reload: bool) -> str:
    """Say that this process serves local `paths` at `url`; the file's path (for `unregister`)."""
    folder = _folder()
    entry = Registered(os.getpid(), url, tuple(_absolute(p) for p in paths if "://" not in p), reload, time.time())
    path = os.path.join(folder, f"{entry.pid}.json")
    staged = f"{path}.tmp"
    for attempt in range(2):  # a server that stops may remove the folder between the two steps
        os.makedirs(folder, mode=0o700, exist_ok=True)
        try:
            with open(staged, "w") as f:
                json.dump(asdict(entry), f)
            break
        except FileNotFoundError:
            if attempt:
                raise
    os.replace(staged, path)
    return path


def register_server(settings: Settings, port: int) -> str | None:
    """Register a server that `invoke` can use as it is: plain HTTP, no keys, one bundle's models
    (not multi-model mode); the file's path, or None where it cannot."""
    if settings.api_keys or settings.tls_cert or settings.multi_model or not settings.paths:
        return None
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    try:
        return register(f"http://{host}:{port}", settings.paths, settings.reload_code)
    except OSError:  # a read-only temporary folder: invoke loads the model itself
        return None


def unregister(path: str) -> None:
    """Remove a server's file, and the folder once no server is left in it (a stopped server
    leaves nothing in the temporary folder)."""
    try:
        os.remove(path)
    except OSError:
        pass
    try:
        os.rmdir(os.path.dirname(path))
    except OSError:  # other servers' files are still there
        pass


def registered() -> Iterator[Registered]:
    """The servers running now (files of processes that are gone are removed)."""
    folder = _folder()
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path) as f:
                doc = json.load(f)
            entry = Registered(int(doc["pid"]), str(doc["url"]), tuple(doc["paths"]), bool(doc["reload"]),
                               float(doc["started"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if process_alive(entry.pid):
            yield entry
        else:
            unregister(path)


def _absolute(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))
