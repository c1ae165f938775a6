"""Input objects: listing a folder, an S3 prefix or a manifest file (fsspec), and opening them.

Every object gets a relative name; its output is `<OUTPUT>/<relative name>.out`. Hidden
files (a path part starting with '.') and S3 folder markers are not inputs.
"""

from __future__ import annotations

import gzip
import io
import mimetypes
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import orjson

from tfservo.batch.job import JobError, TransformJob
from tfservo.codecs.media_types import guess_type
from tfservo.storage.retry import RetryingReader, retry
from tfservo.storage.urls import display_url, is_local, url_to_fs

__all__ = [
    "SMALL_OBJECT_BYTES",
    "guess_content_type",
    "gzip_error",
    "InputObject",
    "list_inputs",
    "NoInputObjects",
    "OpenedInput",
]

SMALL_OBJECT_BYTES = 8 * 2**20  # read whole with one GET; larger objects are streamed



@dataclass(frozen=True)
class InputObject:
    """One input object: where it is, its relative name and (when listed) its size."""

    url: str
    path: str
    rel: str
    size: int | None
    fs: Any = field(compare=False, repr=False)

    @property
    def out_name(self) -> str:
        return self.rel + ".out"


class NoInputObjects(JobError):
    """INPUT names no object (yet: a followed prefix may fill later)."""


def list_inputs(job: TransformJob) -> list[InputObject]:
    """The job's input objects, sorted by relative name."""
    fs, root = url_to_fs(job.input)
    if job.data_type == "ManifestFile":
        objects = _manifest(fs, root, job.input)
    else:
        objects = _prefix(fs, root, job.input)
    if not objects:
        raise NoInputObjects(
            f"no input objects in {job.input}: no file, no folder with files, no objects whose name "
            "starts with it (hidden files do not count); check the path, or use --data-type "
            "ManifestFile for a manifest"
        )
    return sorted(objects, key=lambda o: o.rel)


def _prefix(fs: Any, root: str, url: str) -> list[InputObject]:
    root = root.rstrip("/") or root
    fs.invalidate_cache()
    if retry(lambda: fs.isfile(root), f"looking up {url}"):
        size = retry(lambda: fs.info(root), f"looking up {url}").get("size")
        return [InputObject(display_url(fs, root), root, posixpath.basename(root), size, fs)]
    keep: Callable[[str], bool]
    if retry(lambda: fs.isdir(root), f"looking up {url}"):
        base, keep = root, lambda path: True
    else:  # an S3-style key prefix: everything whose name starts with it
        base = posixpath.dirname(root)
        keep = lambda path: path.startswith(root)
        if not base or not retry(lambda: fs.isdir(base), f"looking up {url}"):
            raise JobError(f"input {url} does not exist; give a folder, a file or an S3 prefix")
    found: dict[str, dict[str, Any]] = retry(lambda: fs.find(base, detail=True), f"listing {url}")
    objects = []
    for path, info in found.items():
        if info.get("type", "file") != "file" or path.endswith("/") or not keep(path):
            continue
        rel = path[len(base):].lstrip("/")
        if not rel or any(part.startswith(".") for part in rel.split("/")):
            continue
        objects.append(InputObject(display_url(fs, path), path, rel, info.get("size"), fs))
    return objects


def _manifest(fs: Any, path: str, url: str) -> list[InputObject]:
    """SageMaker's manifest: [{"prefix": "s3://bucket/prefix/"}, "relative/key", ...]."""
    raw = retry(lambda: fs.cat_file(path), f"reading manifest {url}")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise JobError(f"manifest {url} is not JSON ({exc}); expected [{{\"prefix\": \"s3://...\"}}, \"key\", ...]") from None
    if (
        not isinstance(doc, list)
        or not doc
        or not isinstance(doc[0], dict)
        or not isinstance(doc[0].get("prefix"), str)
    ):
        raise JobError(
            f"manifest {url} must be a JSON array whose first item is {{\"prefix\": \"s3://bucket/prefix/\"}} "
            "followed by keys relative to that prefix"
        )
    prefix = doc[0]["prefix"]
    if "://" not in prefix and not os.path.isabs(prefix) and is_local(fs):
        prefix = os.path.join(os.path.dirname(path), prefix)
    objects = []
    for number, key in enumerate(doc[1:], 2):
        if not isinstance(key, str) or not key.strip("/"):
            raise JobError(f"manifest {url}: item {number} is {key!r}, not a key relative to the prefix")
        full = prefix + key if prefix.endswith("/") or key.startswith("/") else f"{prefix}/{key}"
        obj_fs, obj_path = url_to_fs(full)
        objects.append(InputObject(display_url(obj_fs, obj_path), obj_path, key.lstrip("/"), None, obj_fs))
    rels = [o.rel for o in objects]
    if len(set(rels)) != len(rels):
        dup = next(r for r in rels if rels.count(r) > 1)
        raise JobError(f"manifest {url} lists {dup} more than once; each object gives one .out")
    return objects


class OpenedInput:
    """An input object's bytes as a stream (decompressed when gzip), counting raw bytes read."""

    def __init__(self, obj: InputObject, compression: str) -> None:
        self.obj = obj
        if obj.size is not None and obj.size <= SMALL_OBJECT_BYTES:
            data = retry(lambda: obj.fs.cat_file(obj.path), f"reading {obj.url}")
            self._raw: Any = _Counted(data)
            stream: BinaryIO = io.BytesIO(data)
        else:
            self._raw = RetryingReader(self._open_at, obj.url)
            stream = io.BufferedReader(self._raw, 2**20)
        if compression == "Gzip":
            stream = gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[assignment]
        self.stream = stream

    def _open_at(self, offset: int) -> BinaryIO:
        f: BinaryIO = self.obj.fs.open(self.obj.path, "rb")
        if offset:
            f.seek(offset)
        return f

    @property
    def consumed(self) -> int:
        consumed: int = self._raw.consumed
        return consumed

    def close(self) -> None:
        try:
            self.stream.close()
        finally:
            self._raw.close()


class _Counted:
    def __init__(self, data: bytes) -> None:
        self.consumed = len(data)

    def close(self) -> None:
        pass


def guess_content_type(rel: str, compression: str) -> str:
    """A content type from the object's extension (after .gz), else application/octet-stream."""
    name = rel.lower()
    if name.endswith(".gz") and (compression == "Gzip" or name.count(".") > 1):
        name = name[:-3]
    known = guess_type(posixpath.basename(name))
    if known is not None:
        return known
    guessed, _ = mimetypes.guess_type(name, strict=False)
    return guessed or "application/octet-stream"


def gzip_error(exc: BaseException) -> bool:
    """Whether an exception means the bytes were not gzip (or a truncated gzip stream)."""
    return isinstance(exc, (gzip.BadGzipFile, EOFError)) or "zlib" in type(exc).__module__
