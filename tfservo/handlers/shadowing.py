"""A bundle's requirements against what this process has already imported.

Packages from code/requirements.txt go first on sys.path, so they win for every module not yet
imported. A module already imported (by tfservo, TensorFlow or Keras) cannot be replaced in a
running process: the handler would silently get the server's version. That is an error for a
package requirements.txt names, and a warning for one pip pulled in as a dependency.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import sys
from collections.abc import Iterable

from tfservo.core.errors import BundleError

__all__ = ["check_shadowed_imports"]

log = logging.getLogger("tfservo.handlers")

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def check_shadowed_imports(requirements: str, target: str) -> None:
    """Raise BundleError naming the package when `requirements` lists a package installed into
    `target` at a version other than the one this process has already imported."""
    named = _named_packages(requirements)
    target = os.path.abspath(target)
    for dist in importlib.metadata.distributions(path=[target]):
        name = dist.metadata["Name"] or ""
        loaded = _loaded_elsewhere(dist, target)
        if loaded is None:
            continue
        module, where, version = loaded
        if version == dist.version:
            continue
        if _normalise(name) in named:
            raise BundleError(
                f"{requirements} installs {name} {dist.version}, but {name} {version} is already "
                f"imported in this process (module {module} from {where}, used by tfservo or TensorFlow) "
                f"and cannot be replaced; pin {name}=={version} in requirements.txt, or drop it"
            )
        log.warning(
            "%s pulls in %s %s, but %s %s is already imported from %s; the handler gets %s",
            requirements, name, dist.version, name, version, where, version,
        )


def _named_packages(requirements: str) -> set[str]:
    """The normalised names of the packages a requirements file lists (options and URLs skipped)."""
    names = set()
    with open(requirements, encoding="utf-8", errors="replace") as f:
        for line in f:
            text = line.split("#", 1)[0].strip()
            if text.endswith(".whl"):  # a wheel's file name starts with its distribution's name
                names.add(_normalise(os.path.basename(text).split("-", 1)[0]))
                continue
            if not text or text.startswith(("-", ".", "/")) or ("://" in text and "@" not in text):
                continue
            match = _NAME.match(text)  # also "name @ url"
            if match:
                names.add(_normalise(match.group(1)))
    return names


def _loaded_elsewhere(dist: importlib.metadata.Distribution, target: str) -> tuple[str, str, str] | None:
    """(module, its file, the version this process has) for a top-level module of `dist` already
    imported from outside `target`; None if none is."""
    for top in _top_level(dist):
        module = sys.modules.get(top)
        where = getattr(module, "__file__", None) if module is not None else None
        if not where or os.path.abspath(where).startswith(target + os.sep):
            continue
        return top, where, _version_outside(dist.metadata["Name"] or top, target) or "unknown"
    return None


def _top_level(dist: importlib.metadata.Distribution) -> Iterable[str]:
    text = dist.read_text("top_level.txt")
    if text:
        return [line.strip() for line in text.splitlines() if line.strip()]
    tops = set()
    for file in dist.files or ():
        first = file.parts[0]
        if first.endswith((".dist-info", ".data", ".libs")) or first in ("__pycache__", "bin", ".."):
            continue
        tops.add(first.removesuffix(".py") if len(file.parts) == 1 else first)
    return sorted(tops)


def _version_outside(name: str, target: str) -> str | None:
    """The version of distribution `name` installed anywhere on sys.path but `target`."""
    for dist in importlib.metadata.distributions(name=name):
        if not os.path.abspath(str(dist.locate_file(""))).startswith(target):
            return dist.version
    return None


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
