"""Find the models in a SageMaker TFS bundle: a model dir, a multi-model dir, a tarball or a URL.

Layouts follow the SageMaker TensorFlow Serving container: a model is a directory holding
numeric version subdirectories (its name is the directory's name, "model" for an extracted
archive root, like /opt/ml/model), and `code/` at the bundle root holds the universal
`inference.py`. Remote bundles (any fsspec URL) are downloaded and archives extracted into a
cache directory first, so everything downstream sees plain local directories.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfservo.core.archive_limits import ArchiveLimits
from tfservo.core.errors import BundleError, BundleNotFound
from tfservo.core.scratch import make_scratch_dir

__all__ = [
    "ARCHIVE_MODEL_NAME",
    "CODE_DIR_NAME",
    "LAYOUTS",
    "MAX_VERSION",
    "KERAS_SUFFIX",
    "SAVED_MODEL_FILES",
    "TFLITE_MODEL_FILE",
    "keras_file",
    "serves_tflite",
    "Bundle",
    "discover_versions",
    "is_model_name",
    "ModelSource",
    "open_bundle",
]

log = logging.getLogger(__name__)

ARCHIVE_MODEL_NAME = "model"  # what the SageMaker container calls a model at /opt/ml/model
CODE_DIR_NAME = "code"
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
TFLITE_MODEL_FILE = "model.tflite"  # a TFLite version dir (TF Serving serves these too)
KERAS_SUFFIX = ".keras"  # a Keras 3 version dir: one <name>.keras, as model.save() writes it
MAX_VERSION = 2**63 - 1  # TF Serving versions are int64

_VERSION_RE = re.compile(r"[0-9]+", re.ASCII)
_MODEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
_COMPLETE_MARKER = ".tfservo-complete"
_MAX_WRAPPER_DEPTH = 3  # single-directory wrappers (e.g. export/Servo/) descended at most
_RATIO_FLOOR = 64 * 2**20  # archives that expand to less are not held to the ratio bound
LAYOUTS = (  # what the layouts a bundle may have are, for error messages
    "expected one of: a model dir with numeric version subdirs (<model>/1/saved_model.pb), "
    "a dir of such model dirs (<root>/<model>/1/saved_model.pb, optional <root>/code/), "
    "a SavedModel dir (<dir>/saved_model.pb), each version a SavedModel, a model.tflite or a Keras 3 "
    "<name>.keras file, or a .tar.gz/.tgz/.tar of any of these"
)


def is_model_name(name: str) -> bool:
    """True if `name` is usable as a model name in URLs and configs ([A-Za-z0-9][A-Za-z0-9._-]*)."""
    return _MODEL_NAME_RE.fullmatch(name) is not None


@dataclass(frozen=True)
class ModelSource:
    """One model in a bundle: where its versions live on local disk and its own code/ dir."""

    name: str
    base_path: str
    versions: dict[int, str]
    code_dir: str | None = None

    @property
    def latest_version(self) -> int:
        """The highest version number, which TF Serving's default policy serves."""
        return max(self.versions)


@dataclass(frozen=True)
class Bundle:
    """The models found at `source`, unpacked under the local directory `root`."""

    root: str
    models: dict[str, ModelSource]
    code_dir: str | None = None
    source: str = ""


def discover_versions(model_dir: str) -> dict[int, str]:
    """Map version number → directory for the numeric, non-hidden subdirs of `model_dir`, sorted.

    A bare SavedModel dir (saved_model.pb directly inside, no version subdirs) is version 1.
    Names like 00000123 are version 123; when two names give the same number the first by
    name wins and the other is logged and ignored.
    """
    found: dict[int, str] = {}
    try:
        entries = sorted(os.scandir(model_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return {}
    for entry in entries:
        if not _VERSION_RE.fullmatch(entry.name) or not entry.is_dir():
            continue
        number = int(entry.name)
        if number > MAX_VERSION:
            log.warning("ignoring version dir %s: %d is larger than an int64", entry.path, number)
            continue
        if number in found:
            log.warning(
                "ignoring version dir %s: version %d is already %s; rename or remove one",
                entry.path, number, found[number],
            )
            continue
        found[number] = entry.path
    if not found and _is_saved_model_dir(model_dir):
        return {1: model_dir}
    return dict(sorted(found.items()))


def open_bundle(
    path_or_url: str, *, cache_dir: str | None = None, limits: ArchiveLimits | None = None,
    code_only: bool = False,
) -> Bundle:
    """Find the models at a local path or fsspec URL, downloading/extracting into `cache_dir` first.

    Without `cache_dir`, downloads and extractions go to a temporary directory removed at exit.
    Archives are extracted only within `limits` (defaults: ArchiveLimits()). `code_only`: a
    bundle of code/ alone is allowed (a pipeline's conversion container); else it must hold a model.
    """
    source = str(path_or_url)
    if not source:
        raise BundleError(f"no model path given; {LAYOUTS}")
    work = _WorkDir(cache_dir, limits or ArchiveLimits())
    local = _local_path(source)
    if local is not None:
        root, from_archive = _local_root(local, source, work)
    else:
        root, from_archive = _fetch_remote(source, work)
    models, code_dir = _scan(root, source, from_archive=from_archive, code_only=code_only)
    return Bundle(root=root, models=models, code_dir=code_dir, source=source)


# ----------------------------------------------------------------------------- layout scanning


def _scan(root: str, source: str, *, from_archive: bool,
          code_only: bool = False) -> tuple[dict[str, ModelSource], str | None]:
    """Detect the layout at local dir `root` and return its models (sorted) and universal code dir."""
    code_dir = _code_dir(root)
    current = root
    for _ in range(_MAX_WRAPPER_DEPTH + 1):
        name = ARCHIVE_MODEL_NAME if (from_archive and current == root) else _dir_name(current)
        versions = discover_versions(current)
        if versions:  # (a) a model dir, or (d) a bare SavedModel dir
            if not is_model_name(name):
                raise BundleError(
                    f"model dir {current} is named {name!r}, which is not a valid model name "
                    f"([A-Za-z0-9][A-Za-z0-9._-]*); rename the directory."
                )
            _warn_extra_subdirs(current, versions)
            model = ModelSource(name, current, versions, _code_dir(current))
            return {name: model}, code_dir
        models = _scan_children(current)  # (b) a dir of model dirs
        if models:
            if current != root:
                code_dir = code_dir or _code_dir(current)
            return models, code_dir
        wrapped = _single_subdir(current)
        if wrapped is None:
            break
        log.info("descending into %s, the only directory in %s", wrapped, current)
        current = wrapped
    if code_only and code_dir:
        return {}, code_dir
    raise BundleError(f"no models found in {source} (local dir {root}); {LAYOUTS}")


def _scan_children(parent: str) -> dict[str, ModelSource]:
    """Models that are direct subdirs of `parent`; subdirs with no version dir are logged and skipped."""
    models: dict[str, ModelSource] = {}
    for entry in sorted(os.scandir(parent), key=lambda e: e.name):
        if entry.name.startswith(".") or entry.name == CODE_DIR_NAME or not entry.is_dir():
            continue
        versions = discover_versions(entry.path)
        if not versions:
            log.warning("skipping %s: it holds no numeric version dir (e.g. 1/saved_model.pb)", entry.path)
            continue
        if not is_model_name(entry.name):
            log.warning(
                "skipping %s: %r is not a valid model name ([A-Za-z0-9][A-Za-z0-9._-]*); rename it",
                entry.path, entry.name,
            )
            continue
        models[entry.name] = ModelSource(entry.name, entry.path, versions, _code_dir(entry.path))
    return models


def _warn_extra_subdirs(model_dir: str, versions: dict[int, str]) -> None:
    """Log subdirs of a single-model dir that look like further models and will not be served."""
    for entry in sorted(os.scandir(model_dir), key=lambda e: e.name):
        if (
            entry.is_dir()
            and not entry.name.startswith(".")
            and entry.name != CODE_DIR_NAME
            and not _VERSION_RE.fullmatch(entry.name)
            and discover_versions(entry.path)
        ):
            log.warning(
                "ignoring %s: %s is a single model dir (it has version dirs %s), so nested models "
                "are not served; move it beside %s instead",
                entry.path, model_dir, sorted(versions), model_dir,
            )


def _single_subdir(parent: str) -> str | None:
    """The only non-hidden, non-code subdir of `parent` (an archive's wrapper dir), else None."""
    dirs = [
        e.path for e in os.scandir(parent)
        if e.is_dir() and not e.name.startswith(".") and e.name != CODE_DIR_NAME
    ]
    return dirs[0] if len(dirs) == 1 else None


def _code_dir(path: str) -> str | None:
    """`path`/code if it is a directory, else None."""
    candidate = os.path.join(path, CODE_DIR_NAME)
    return candidate if os.path.isdir(candidate) else None


def _is_saved_model_dir(path: str) -> bool:
    """True if a SavedModel file (or a TFLite model, or a .keras file) lies directly in `path`."""
    return (_has_saved_model(path) or os.path.isfile(os.path.join(path, TFLITE_MODEL_FILE))
            or bool(_keras_files(path)))


def _has_saved_model(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, f)) for f in SAVED_MODEL_FILES)


def serves_tflite(version_dir: str, prefer_tflite: bool) -> bool:
    """Whether a version dir is served from its model.tflite: where it has no SavedModel, or
    --prefer-tflite-model says so (as TF Serving chooses)."""
    return os.path.isfile(os.path.join(version_dir, TFLITE_MODEL_FILE)) and (
        prefer_tflite or not _has_saved_model(version_dir)
    )


def keras_file(version_dir: str) -> str | None:
    """The `.keras` file a version dir is served from: its one <name>.keras where it holds no
    SavedModel (a SavedModel beside it is what TF Serving would serve); None if it has none."""
    if _has_saved_model(version_dir):
        return None
    found = _keras_files(version_dir)
    if len(found) > 1:
        raise BundleError(
            f"version dir {version_dir} holds {len(found)} .keras files ({', '.join(os.path.basename(f) for f in found)}); "
            "a version is one model: keep one, or give each its own version dir"
        )
    return found[0] if found else None


def _keras_files(path: str) -> list[str]:
    try:
        return sorted(e.path for e in os.scandir(path) if e.name.endswith(KERAS_SUFFIX) and e.is_file())
    except OSError:
        return []


def _dir_name(path: str) -> str:
    """The last component of a directory path, ignoring trailing separators."""
    return os.path.basename(os.path.normpath(path))


# ----------------------------------------------------------------------------- local sources


def _local_path(source: str) -> str | None:
    """The local path for a plain path or file:// URL; None for a remote URL."""
    if "://" not in source:
        return source
    if source.split("://", 1)[0].lower() in ("file", "local"):
        import fsspec.core

        path: str = fsspec.core.url_to_fs(source)[1]
        return path
    return None


def _local_root(path: str, source: str, work: _WorkDir) -> tuple[str, bool]:
    """The local dir to scan for `path` (the dir, or where its archive was extracted) and if extracted."""
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(path):
        return path, False
    if not os.path.exists(path):
        raise BundleNotFound(f"model path {source} does not exist; check the path. {LAYOUTS}")
    if not tarfile.is_tarfile(path):
        raise BundleError(f"model path {source} is a file but not a tar archive; {LAYOUTS}")
    st = os.stat(path)
    key = _cache_key({"archive": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    slot = work.slot(key)
    return _cached(slot, ARCHIVE_MODEL_NAME) or _extract(path, source, slot, work.limits), True


def _extract(archive: str, source: str, slot: str, limits: ArchiveLimits) -> str:
    """Extract `archive` safely (tarfile's "data" filter, within `limits`, checked on the
    members' headers before anything is written) to `slot`/model and mark the slot complete."""
    if not hasattr(tarfile, "data_filter"):
        raise BundleError(
            f"cannot safely extract {source}: this Python's tarfile has no extraction filters; "
            f"use Python 3.11.4 or newer, or extract the archive yourself and pass the directory"
        )
    target = os.path.join(slot, ARCHIVE_MODEL_NAME)
    staging = tempfile.mkdtemp(prefix=".extract-", dir=slot)
    try:
        try:
            with tarfile.open(archive, "r:*") as tar:
                members = _bounded_members(tar, os.path.getsize(archive), source, slot, limits)
                tar.extractall(staging, members=members, filter="data")
        except tarfile.FilterError as e:
            raise BundleError(
                f"refusing to extract {source}: {e}. Rebuild the archive with relative member "
                f"paths (no absolute paths, '..' or links leaving the archive)."
            ) from e
        except (tarfile.TarError, EOFError, OSError) as e:
            raise BundleError(f"could not extract {source}: {e}; check that it is a complete tar archive") from e
        shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(staging, target)
        except OSError:  # another process finished the same extraction first
            if not _cached(slot, ARCHIVE_MODEL_NAME):
                raise
            return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _mark_complete(slot)
    return target


def _bounded_members(
    tar: tarfile.TarFile, compressed: int, source: str, slot: str, limits: ArchiveLimits
) -> list[tarfile.TarInfo]:
    """Every member of `tar`, read from the headers only; BundleError as soon as one bound is passed."""
    max_bytes = limits.max_bytes if limits.max_bytes is not None else shutil.disk_usage(slot).free
    members: list[tarfile.TarInfo] = []
    total = 0
    for member in tar:
        members.append(member)
        total += member.size if member.isfile() else 0
        if len(members) > limits.max_files:
            raise BundleError(
                f"refusing to extract {source}: it holds more than {limits.max_files:,} members; "
                f"if that is right, raise TFSERVO_ARCHIVE_MAX_FILES"
            )
        if total > max_bytes:
            where = "the bound of" if limits.max_bytes is not None else f"the free space in {slot},"
            raise BundleError(
                f"refusing to extract {source}: its files hold more than {total / 2**20:,.0f} MiB, over "
                f"{where} {max_bytes / 2**20:,.0f} MiB; free space or raise TFSERVO_ARCHIVE_MAX_GB"
            )
        if total > _RATIO_FLOOR and total > limits.max_ratio * compressed:
            raise BundleError(
                f"refusing to extract {source}: its files hold more than {total / 2**20:,.0f} MiB from "
                f"{compressed / 2**20:,.1f} MiB compressed, over {limits.max_ratio:g}x (a decompression "
                f"bomb?); if the archive is genuine, raise TFSERVO_ARCHIVE_MAX_RATIO"
            )
    return members


def _cached(slot: str, name: str) -> str | None:
    """`slot`/`name` if an earlier download or extraction there finished, else None."""
    target = os.path.join(slot, name)
    if os.path.exists(os.path.join(slot, _COMPLETE_MARKER)) and os.path.isdir(target):
        log.info("reusing %s", target)
        return target
    return None


# ----------------------------------------------------------------------------- remote sources


def _fetch_remote(url: str, work: _WorkDir) -> tuple[str, bool]:
    """Download `url` (an fsspec URL to a dir or archive) into the cache: (local root, if extracted)."""
    import fsspec.core

    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise BundleError(f"cannot open {url}: {e}; install the fsspec backend for its protocol") from e
    try:
        fs.invalidate_cache()
        if fs.isfile(path):
            return _fetch_archive(fs, path, url, work), True
        files = fs.find(path, detail=True)
        if not files:
            raise FileNotFoundError(path)
        return _fetch_dir(fs, path, url, files, work), False
    except BundleError:
        raise
    except FileNotFoundError as e:
        raise BundleNotFound(f"model URL {url} does not exist or is empty; check the bucket and prefix") from e
    except PermissionError as e:
        raise BundleError(f"access denied reading {url}: {e}; check the credentials") from e
    except Exception as e:  # backends raise their own types (botocore's NoCredentialsError, ...)
        raise BundleError(
            f"could not download {url}: {type(e).__name__}: {e}; check the URL, the credentials "
            f"and, for S3-compatible stores, AWS_ENDPOINT_URL"
        ) from e


def _fetch_archive(fs: Any, path: str, url: str, work: _WorkDir) -> str:
    """Download one remote archive and extract it; reuses a cached extraction of the same object."""
    info = fs.info(path)
    key = _cache_key({"url": url, **_fingerprint(info)})
    slot = work.slot(key)
    cached = _cached(slot, ARCHIVE_MODEL_NAME)
    if cached:
        return cached
    local = os.path.join(slot, ".download-" + (posixpath.basename(path) or "archive"))
    fs.get_file(path, local)
    if not tarfile.is_tarfile(local):
        os.remove(local)
        raise BundleError(f"model URL {url} is a file but not a tar archive; {LAYOUTS}")
    try:
        return _extract(local, url, slot, work.limits)
    finally:
        if os.path.exists(local):
            os.remove(local)


def _fetch_dir(fs: Any, base: str, url: str, files: dict[str, dict[str, Any]], work: _WorkDir) -> str:
    """Download every object under remote dir `base` into <cache>/<key>/<dir name>, keeping the layout."""
    base = base.rstrip("/")
    listing = []
    for remote, info in sorted(files.items()):
        if info.get("type") == "directory" or remote.endswith("/"):
            continue
        rel = posixpath.relpath(remote, base)
        parts = rel.split("/")
        if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise BundleError(f"refusing to download {url}: object {remote!r} has an unsafe path; rename it")
        listing.append((rel, remote, _fingerprint(info)))
    name = posixpath.basename(base) or ARCHIVE_MODEL_NAME
    key = _cache_key({"url": url, "files": [(rel, fp) for rel, _, fp in listing]})
    slot = work.slot(key)
    cached = _cached(slot, name)
    if cached:
        return cached
    target = os.path.join(slot, name)
    shutil.rmtree(target, ignore_errors=True)
    for rel, remote, _ in listing:
        local = os.path.join(target, *rel.split("/"))
        os.makedirs(os.path.dirname(local), exist_ok=True)
        fs.get_file(remote, local)
    _mark_complete(slot)
    return target


def _fingerprint(info: Mapping[str, object]) -> dict[str, object]:
    """What identifies one version of a remote object: size plus ETag / mtime where the store has them."""
    keys = ("size", "ETag", "etag", "LastModified", "mtime", "md5", "generation")
    return {k: str(info[k]) for k in keys if info.get(k) is not None}


# ----------------------------------------------------------------------------- cache directory


def _cache_key(parts: Mapping[str, object]) -> str:
    """A short stable directory name for a source and its fingerprint."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _mark_complete(slot: str) -> None:
    """Record that `slot` holds a finished download/extraction, so later opens reuse it."""
    with open(os.path.join(slot, _COMPLETE_MARKER), "w") as f:
        f.write("ok\n")


class _WorkDir:
    """The cache directory for downloads and extractions, created only when first needed (a
    scratch dir of this process, `core.scratch`, when no cache_dir is given)."""

    def __init__(self, cache_dir: str | None, limits: ArchiveLimits) -> None:
        self._dir = os.path.abspath(os.path.expanduser(cache_dir)) if cache_dir else None
        self.limits = limits

    def slot(self, key: str) -> str:
        """<cache>/<key>, created."""
        if self._dir is None:
            self._dir = make_scratch_dir("tfservo-bundle-")
        path = os.path.join(self._dir, key)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise BundleError(f"cannot create cache dir {path}: {e}; pass a writable cache_dir") from e
        return path
