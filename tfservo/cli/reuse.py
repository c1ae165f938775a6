"""`tfservo invoke` through a server already serving the bundle (server.registry): the answer in
tens of milliseconds instead of the seconds that importing TensorFlow and loading the model take.
A server is used only where its answer is the one an in-process invoke would give: it serves
this very path, and either re-imports handler code on change (--reload) or nothing in the bundle
changed since it started."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass

from tfservo.server.registry import Registered, registered

__all__ = ["Answered", "invoke_running"]

_MAX_FILES = 10_000  # a bundle with more is not walked for changes: invoke loads it itself


@dataclass(frozen=True)
class Answered:
    """What a running server answered: its status, body, and which server it was."""

    status: int
    body: bytes
    server: Registered


def invoke_running(
    path: str, body: bytes, content_type: str, accept: str | None, custom_attributes: str | None,
    model_name: str | None,
) -> Answered | None:
    """The answer of a running server that serves `path` as it is now, or None (none does, or it
    could not be reached: the caller invokes in-process)."""
    if model_name and custom_attributes and "tfs-model-name" in custom_attributes:
        return None  # which of the two wins is the in-process invoker's to say
    target = os.path.realpath(os.path.expanduser(path))
    for server in registered():
        if target not in server.paths or (not server.reload and _changed_since(target, server.started)):
            continue
        attributes = ",".join(a for a in (custom_attributes, f"tfs-model-name={model_name}" if model_name else None) if a)
        headers = {"Content-Type": content_type, **({"Accept": accept} if accept else {}),
                   **({"X-Amzn-SageMaker-Custom-Attributes": attributes} if attributes else {})}
        request = urllib.request.Request(f"{server.url}/invocations", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=300) as answer:
                return Answered(answer.status, answer.read(), server)
        except urllib.error.HTTPError as exc:
            return Answered(exc.code, exc.read(), server)
        except (urllib.error.URLError, OSError):
            continue  # stopping, or not this machine's any more: try the next, else load it here
    return None


def _changed_since(path: str, started: float) -> bool:
    """Whether anything under `path` (or the file itself) was modified after `started`."""
    try:
        if not os.path.isdir(path):
            return os.stat(path).st_mtime > started
        seen = 0
        for root, _, files in os.walk(path):
            for name in files:
                seen += 1
                if seen > _MAX_FILES or os.stat(os.path.join(root, name)).st_mtime > started:
                    return True
    except OSError:
        return True
    return False
