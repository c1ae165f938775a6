"""A bundle's requirements against what this process has already imported.

Packages from code/requirements.txt go first on sys.path, so they win for every module not yet
imported. A module already imported (by tfservo, TensorFlow or Keras) cannot be replaced in a
running process: the handler would silently get the server's version. That is an error for a
package requirements.txt names at a version the loaded one does not satisfy, and a warning
otherwise; requirements this environment already satisfies are not installed at all.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import sys
from collections.abc import Iterable, Iterator

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion

from tfservo.core.errors import BundleError

__all__ = ["check_shadowed_imports", "satisfied_here"]

log = logging.getLogger("tfservo.handlers")

_WHERE_OPTIONS = ("-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--no-index", "--trusted-host",
                  "--prefer-binary", "--only-binary", "--no-binary", "--pre")


def check_shadowed_imports(requirements: str, target: str) -> None:
    """Raise BundleError naming the package when `requirements` asks for a version of a package
    that this process has already imported at a version outside what it asks for."""
    named = _named_packages(requirements)
    target = os.path.abspath(target)
    for dist in importlib.metadata.distributions(path=[target]):
        name = dist.metadata["Name"] or ""
        loaded = _loaded_elsewhere(dist, target)
        if loaded is None:
            continue
        module, where, version = loaded
        version = version or "(version unknown)"
        if version == dist.version:
            continue
        wanted = named.get(_normalise(name))
        if wanted is not None and not _satisfies(wanted, version):
            raise BundleError(
                f"{requirements} installs {name} {dist.version}, but {name} {version} is already "
                f"imported in this process (module {module} from {where}, used by tfservo or TensorFlow) "
                f"and cannot be replaced; pin {name}=={version} in requirements.txt, or drop it"
            )
        log.warning(
            "%s installs %s %s, but %s %s is already imported from %s; the handler gets %s%s",
            requirements, name, dist.version, name, version, where, version,
            f", which satisfies {name}{wanted}" if wanted is not None else "",
        )


def satisfied_here(requirements: str) -> list[str] | None:
    """`name version` of each requirement when this environment already satisfies every one (as
    the container's `pip install -r` would find them all installed), so there is nothing for pip to
    do; None when anything is missing, pinned elsewhere, or not a plain `name<spec>` line."""
    found = []
    for text, requirement in _requirement_lines(requirements):
        if text.startswith(_WHERE_OPTIONS):
            continue  # where pip looks: nothing to install by itself (-r, -e, -c still need pip)
        if requirement is None or requirement.url or requirement.extras:
            return None
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue  # not for this platform
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            return None
        if not _satisfies(requirement.specifier, version):
            return None
        found.append(f"{requirement.name} {version}")
    return found


def _named_packages(requirements: str) -> dict[str, SpecifierSet]:
    """The packages a requirements file lists (normalised name → the versions it accepts); a
    wheel file's name gives its version; options and other paths are skipped."""
    named: dict[str, SpecifierSet] = {}
    for text, requirement in _requirement_lines(requirements):
        if text.endswith(".whl"):  # a wheel's file name is NAME-VERSION-...
            name, _, rest = os.path.basename(text).partition("-")
            named[_normalise(name)] = SpecifierSet(f"=={rest.split('-', 1)[0]}")
        elif requirement is not None:
            named[_normalise(requirement.name)] = requirement.specifier
    return named


def _requirement_lines(requirements: str) -> Iterator[tuple[str, Requirement | None]]:
    """Each line of a requirements file that says something, comments removed, with its
    requirement as pip reads it (None for options, paths and what `packaging` cannot parse)."""
    with open(requirements, encoding="utf-8", errors="replace") as f:
        for line in f:
            text = line.split(" #", 1)[0].strip()
            if not text or text.startswith("#"):
                continue
            try:
                requirement = None if text.startswith(("-", ".", "/")) else Requirement(text)
            except InvalidRequirement:
                requirement = None
            yield text, requirement


def _loaded_elsewhere(dist: importlib.metadata.Distribution, target: str) -> tuple[str, str, str] | None:
    """(module, its file, the version this process has) for a top-level module of `dist` already
    imported from outside `target`; None if none is."""
    for top in _top_level(dist):
        module = sys.modules.get(top)
        where = getattr(module, "__file__", None) if module is not None else None
        if not where or os.path.abspath(where).startswith(target + os.sep):
            continue
        return top, where, _version_outside(dist.metadata["Name"] or top, where) or ""
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


def _version_outside(name: str, module_file: str) -> str | None:
    """The version of distribution `name` installed where `module_file` was imported from."""
    for dist in importlib.metadata.distributions(name=name):
        base = os.path.abspath(str(dist.locate_file("")))
        if os.path.abspath(module_file).startswith(base + os.sep):
            return dist.version
    return None


def _satisfies(wanted: SpecifierSet, version: str) -> bool:
    try:
        return wanted.contains(version, prereleases=True)
    except InvalidVersion:  # a version pip itself could not compare
        return False


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
