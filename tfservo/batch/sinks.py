"""Output objects that appear under their final name only when complete.

Locally an output is written to a hidden temporary name beside it and renamed; on S3 (any
fsspec store) it is spooled locally and sent in one PUT, or a multipart upload that is
completed only at the end, so a reader never sees a partial object under the final name.
What a killed run leaves (temporary files, unfinished S3 uploads) is cleaned up by the next.
"""

from __future__ import annotations

import io
import logging
import os
import posixpath
import re
import tempfile
from collections.abc import Iterable
from typing import Any

from tfservo.core.processes import process_alive
from tfservo.storage.retry import retry
from tfservo.storage.urls import display_url, is_local, url_to_fs

__all__ = ["SPOOL_BYTES", "ObjectWriter", "OutputStore"]

log = logging.getLogger("tfservo.batch")

SPOOL_BYTES = 16 * 2**20
_PARTIAL = re.compile(r"^\..+\.tfservo-partial-(\d+)-\d+$")


class OutputStore:
    """The OUTPUT folder or prefix: what is already there, and atomic writers into it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, root = url_to_fs(url)
        self.local = is_local(self.fs)
        self.root = root.rstrip("/") or root
        self._counter = 0

    def path(self, name: str) -> str:
        return posixpath.join(self.root, name) if not self.local else os.path.join(self.root, *name.split("/"))

    def display(self, name: str) -> str:
        return display_url(self.fs, self.path(name))

    def existing(self) -> set[str]:
        """Relative names of the objects already in OUTPUT."""
        if self.local:
            names = set()
            for folder, _, files in os.walk(self.root):
                rel_dir = os.path.relpath(folder, self.root)
                for file in files:
                    rel = file if rel_dir == "." else f"{rel_dir}/{file}".replace(os.sep, "/")
                    names.add(rel)
            return names
        self.fs.invalidate_cache()
        try:
            found = retry(lambda: self.fs.find(self.root), f"listing {self.url}")
        except FileNotFoundError:
            return set()
        return {p[len(self.root):].lstrip("/") for p in found}

    def clean_partials(self) -> int:
        """Delete temporary files left by runs that were killed (their process is gone)."""
        if not self.local or not os.path.isdir(self.root):
            return 0
        removed = 0
        for folder, _, files in os.walk(self.root):
            for file in files:
                match = _PARTIAL.match(file)
                if match and not _alive(int(match.group(1))):
                    try:
                        os.remove(os.path.join(folder, file))
                        removed += 1
                    except OSError:
                        pass
        return removed

    def abort_uploads(self, names: Iterable[str]) -> int:
        """Abort unfinished S3 multipart uploads to `names` (a killed run's; S3 keeps and bills
        their parts until then). Uploads to any other key are left alone."""
        if self.local or not hasattr(self.fs, "call_s3"):
            return 0
        bucket, prefix, _ = self.fs.split_path(self.root)
        wanted = {self.fs.split_path(self.path(name))[1] for name in names}
        query = {"Bucket": bucket, "Prefix": f"{prefix}/" if prefix else ""}
        aborted = 0
        while True:
            page = self._s3("list_multipart_uploads", f"listing unfinished uploads under {self.url}", **query)
            for upload in page.get("Uploads", []):
                key, upload_id = upload["Key"], upload["UploadId"]
                if key not in wanted:
                    continue
                try:
                    self._s3("abort_multipart_upload", f"aborting the unfinished upload to s3://{bucket}/{key}",
                             Bucket=bucket, Key=key, UploadId=upload_id)
                except FileNotFoundError:  # finished or aborted meanwhile
                    continue
                log.info("aborted an unfinished upload to s3://%s/%s (started %s) left by an interrupted run",
                         bucket, key, upload.get("Initiated"))
                aborted += 1
            if not page.get("IsTruncated"):
                return aborted
            query.update(KeyMarker=page["NextKeyMarker"], UploadIdMarker=page["NextUploadIdMarker"])

    def writer(self, name: str) -> ObjectWriter:
        """A writer whose content becomes `name` on commit()."""
        self._counter += 1
        if self.local:
            return _LocalWriter(self.path(name), self._counter)
        return _RemoteWriter(self, name)

    def get(self, name: str) -> bytes:
        """The bytes of one small object in OUTPUT; FileNotFoundError when it is not there."""
        path = self.path(name)
        data: bytes = retry(lambda: self.fs.cat_file(path), f"reading {self.display(name)}")
        return data

    def put(self, name: str, data: bytes) -> None:
        """Write a whole small object atomically."""
        w = self.writer(name)
        w.write(data)
        w.commit()

    def remove(self, name: str) -> None:
        path = self.path(name)
        try:
            if self.local:
                os.remove(path)
            else:
                retry(lambda: self.fs.rm_file(path), f"removing {self.display(name)}")
        except FileNotFoundError:
            pass

    def remove_all(self, names: Iterable[str]) -> None:
        """Remove several objects (on S3 up to 1000 per request); missing ones are fine."""
        names = sorted(names)
        if self.local or not hasattr(self.fs, "call_s3"):
            for name in names:
                self.remove(name)
            return
        bucket = self.fs.split_path(self.root)[0]
        keys = [{"Key": self.fs.split_path(self.path(name))[1]} for name in names]
        for start in range(0, len(keys), 1000):
            chunk = keys[start:start + 1000]
            done = self._s3("delete_objects", f"removing {len(chunk)} objects from {self.url}",
                            Bucket=bucket, Delete={"Objects": chunk, "Quiet": True})
            if done.get("Errors"):
                first = done["Errors"][0]
                raise OSError(
                    f"cannot remove s3://{bucket}/{first['Key']}: {first.get('Code')}: {first.get('Message')}"
                )
        self.fs.invalidate_cache(self.root)

    def _s3(self, operation: str, what: str, **params: Any) -> dict[str, Any]:
        """One S3 API call (s3fs's client), retried while it fails transiently."""
        return retry(lambda: self.fs.call_s3(operation, **params), what)


class ObjectWriter:
    """Bytes appended in order; commit() publishes them under the final name, abort() drops them."""

    size = 0

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def commit(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError


class _LocalWriter(ObjectWriter):
    def __init__(self, final: str, counter: int) -> None:
        self.final = final
        folder, base = os.path.split(final)
        os.makedirs(folder, exist_ok=True)
        self.temp = os.path.join(folder, f".{base}.tfservo-partial-{os.getpid()}-{counter}")
        self._file = open(self.temp, "wb")
        self.size = 0

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self.size += len(data)

    def commit(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.temp, self.final)

    def abort(self) -> None:
        self._file.close()
        try:
            os.remove(self.temp)
        except FileNotFoundError:
            pass


class _RemoteWriter(ObjectWriter):
    def __init__(self, store: OutputStore, name: str) -> None:
        self.store = store
        self.name = name
        self._buffer: Any = io.BytesIO()
        self._spilled = False
        self.size = 0

    def write(self, data: bytes) -> None:
        if not self._spilled and self.size + len(data) > SPOOL_BYTES:
            spill = tempfile.NamedTemporaryFile(prefix="tfservo-out-", delete=False)
            spill.write(self._buffer.getvalue())
            self._buffer, self._spilled = spill, True
        self._buffer.write(data)
        self.size += len(data)

    def commit(self) -> None:
        path = self.store.path(self.name)
        fs = self.store.fs
        what = f"writing {self.store.display(self.name)}"
        if self._spilled:
            self._buffer.close()
            try:
                retry(lambda: fs.put_file(self._buffer.name, path), what)
            finally:
                os.remove(self._buffer.name)
        else:
            data = self._buffer.getvalue()
            retry(lambda: fs.pipe_file(path, data), what)

    def abort(self) -> None:
        self._buffer.close()
        if self._spilled:
            try:
                os.remove(self._buffer.name)
            except FileNotFoundError:
                pass


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours from an earlier engine in this process are stale too
    return process_alive(pid)
    return True
