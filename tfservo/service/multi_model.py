"""SageMaker multi-model mode: load and unload models at run time, confined to a model root.

Behaviour and messages follow the SageMaker TensorFlow Serving container's python_service:
`load` answers "Successfully loaded model NAME, ..." or fails with 409 (already loaded), 404
(no valid base path), 400 (bad request or name), 403 (url outside the model root) or 507 (not
enough memory). Every file the loader would read — the version dirs and the model's own
code/ — must resolve (links followed) inside the model root, or nothing is loaded: checked on
the paths first for a clear early answer, then for good while copying the model into a
private snapshot through file descriptors (`model_snapshot.py`), which is all the loader
reads. Universal code/ at the model root applies to models without their own.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import stat
import tempfile
import threading
import uuid
import weakref

import orjson

from tfservo.core.errors import (
    AlreadyExists,
    BundleError,
    InsufficientMemory,
    InvalidArgument,
    ModelLoadError,
    NotFound,
    PermissionDenied,
)
from tfservo.core.memory import available_memory_bytes, tree_bytes
from tfservo.core.paths import within
from tfservo.core.scratch import make_scratch_dir
from tfservo.core.settings import DEFAULT_MEMORY_FACTOR, DEFAULT_MODEL_ROOT
from tfservo.models.bundle import CODE_DIR_NAME, ModelSource, discover_versions, is_model_name
from tfservo.models.model_config import VersionPolicy
from tfservo.models.servables import State
from tfservo.models.snapshot import copy_confined
from tfservo.service.factory import ModelService

__all__ = ["MultiModelEndpoint", "parse_load_request"]

log = logging.getLogger("tfservo.multi_model")

_MAX_PATH, _MAX_NAME = 4096, 255  # what Linux allows a path and one of its names



class MultiModelEndpoint:
    """The models loaded through POST /models, each from a dir under `model_root`."""

    def __init__(
        self,
        service: ModelService,
        model_root: str = DEFAULT_MODEL_ROOT,
        *,
        memory_factor: float = DEFAULT_MEMORY_FACTOR,
    ) -> None:
        self.remote_root = "://" in model_root and not model_root.startswith("file://")
        if model_root.startswith("file://"):
            model_root = model_root[len("file://"):]
        if not self.remote_root and not os.path.isdir(model_root):
            raise BundleError(
                f"multi-model root {model_root} is not a directory; create it or pass --model-root DIR"
            )
        self.service = service
        # A remote root (s3://) serves archives named by X-Amzn-SageMaker-Target-Model only.
        self.model_root = model_root.rstrip("/") + "/" if self.remote_root else os.path.realpath(model_root)
        self.memory_factor = memory_factor  # Settings.memory_factor ($TFSERVO_MME_MEMORY_FACTOR)
        self._urls: dict[str, str] = {}
        self._copies: dict[str, str] = {}  # name → its snapshot dir
        self._busy: set[str] = set()  # names being loaded or unloaded
        self._snapshots = make_scratch_dir("tfservo-models-")
        weakref.finalize(self, shutil.rmtree, self._snapshots, True)  # a service closed before its process leaves
        self._lock = threading.Lock()
        universal = os.path.join(self.model_root, CODE_DIR_NAME)
        if not self.remote_root and os.path.isfile(os.path.join(universal, "inference.py")):
            service.set_universal_code(universal)
            log.info("universal handlers from %s apply to models without their own code/", universal)

    # -- requests ----------------------------------------------------------------------------

    def is_loaded(self, name: str) -> bool:
        with self._lock:
            return name in self._urls

    def load(self, name: str, url: str, policy: VersionPolicy | None = None) -> dict[str, str]:
        """Load the model dir at `url` (inside the model root) as `name`; all of it or nothing
        (the versions `policy` selects; every version without one)."""
        if not isinstance(name, str) or not is_model_name(name):
            raise InvalidArgument(
                f"model_name {name!r} is not valid: use letters, digits, '.', '_' and '-', "
                "starting with a letter or digit"
            )
        if not isinstance(url, str) or not url:
            raise InvalidArgument(f"url for model {name} must be a non-empty path under {self.model_root}")
        if self.remote_root:
            raise InvalidArgument(
                f"the model root {self.model_root} is remote: POST /models loads local dirs only; name a "
                "model.tar.gz under the root in X-Amzn-SageMaker-Target-Model instead"
            )
        with self._lock:
            if name in self._urls or name in self._busy:
                raise AlreadyExists(f"Model {name} is already loaded.")
            self._busy.add(name)
        try:
            path = self._confine(name, url)
            versions = _numeric_versions(path)
            if not versions:
                raise NotFound(f"Could not find valid base path {url} for servable {name}")
            code_path = os.path.join(path, CODE_DIR_NAME)
            code_dir = code_path if os.path.isdir(code_path) else None
            self._check_links(name, url, [*versions.values(), *([code_dir] if code_dir else [])])
            self._check_memory(name, versions)
            copy = self._snapshot(name, url, path)
            try:
                versions = _numeric_versions(copy)
                if not versions:
                    raise NotFound(f"Could not find valid base path {url} for servable {name}")
                code_copy = os.path.join(copy, CODE_DIR_NAME)
                self._load(name, url, ModelSource(name, copy, versions, code_copy if os.path.isdir(code_copy) else None),
                           policy)
            except BaseException:
                shutil.rmtree(copy, ignore_errors=True)
                raise
            with self._lock:
                self._urls[name] = url
                self._copies[name] = copy
        finally:
            with self._lock:
                self._busy.discard(name)
        ports = f"listening on rest port {_port(self.service.rest_base)}"
        if self.service.grpc_port:
            ports += f" and grpc port {self.service.grpc_port}"
        return {"success": f"Successfully loaded model {name}, {ports}."}

    def private_dir(self, name: str) -> str:
        """A new dir of this endpoint's own for `name`'s files (see `load_private`)."""
        return tempfile.mkdtemp(prefix=f"{name[:64]}-", dir=self._snapshots)

    def load_private(self, name: str, url: str, source: ModelSource, private: str) -> None:
        """Load `source`, whose files lie in `private` (from `private_dir`, removed on unload or
        failure), as `name`: what X-Amzn-SageMaker-Target-Model loads from an archive."""
        with self._lock:
            if name in self._urls or name in self._busy:
                shutil.rmtree(private, ignore_errors=True)
                raise AlreadyExists(f"Model {name} is already loaded.")
            self._busy.add(name)
        try:
            try:
                self._load(name, url, source, arrived="X-Amzn-SageMaker-Target-Model")
            except BaseException:
                shutil.rmtree(private, ignore_errors=True)
                raise
            with self._lock:
                self._urls[name] = url
                self._copies[name] = private
        finally:
            with self._lock:
                self._busy.discard(name)

    def unload(self, name: str) -> dict[str, str]:
        """Unload `name` after its in-flight requests finish."""
        with self._lock:
            if name not in self._urls or name in self._busy:
                raise NotFound(f"Model {name} is not loaded yet.")
            self._busy.add(name)
            del self._urls[name]  # new invocations get 404 from here on
        try:
            self.service.remove_model(name)
            shutil.rmtree(self._copies.pop(name), ignore_errors=True)
        finally:
            with self._lock:
                self._busy.discard(name)
        log.info("model %s unloaded", name)
        return {"success": f"Successfully unloaded model {name}."}

    def list_models(self) -> dict[str, object]:
        """Every loaded model → its TF Serving status (GET /v1/models/NAME)."""
        with self._lock:
            names = sorted(self._urls)
        return {name: self.service.api.status(name, None, None) for name in names}

    def describe(self, name: str) -> dict[str, object]:
        """One model's url and TF Serving status, or NotFound."""
        with self._lock:
            url = self._urls.get(name)
        if url is None:
            raise NotFound(f"Model {name} is not loaded yet.")
        return {"model": {"name": name, "url": url, **self.service.api.status(name, None, None)}}

    # -- checks ------------------------------------------------------------------------------

    def _confine(self, name: str, url: str) -> str:
        """The real path of `url`, which must lie inside the model root (403 otherwise)."""
        if "\x00" in url:
            raise InvalidArgument(f"url for model {name} contains a NUL byte; give a path under {self.model_root}")
        if len(url) > _MAX_PATH or any(len(part.encode()) > _MAX_NAME for part in url.split("/")):
            raise InvalidArgument(
                f"url for model {name} is too long ({len(url)} characters, or a part over {_MAX_NAME} bytes); "
                f"give a path under {self.model_root}"
            )
        path = url
        if "://" in url:
            scheme, rest = url.split("://", 1)
            if scheme.lower() != "file":
                raise PermissionDenied(
                    f"url {url} for model {name} is not a local path; multi-model loads read only "
                    f"from the model root {self.model_root}"
                )
            path = rest
        if ".." in path.replace("\\", "/").split("/"):
            raise PermissionDenied(
                f"url {url} for model {name} contains '..'; give a path inside the model root "
                f"{self.model_root} without '..'"
            )
        if not os.path.isabs(path):
            path = os.path.join(self.model_root, path)
        real = os.path.realpath(path)
        if not within(real, self.model_root):
            raise PermissionDenied(
                f"url {url} for model {name} resolves to {real}, outside the model root "
                f"{self.model_root}; put the model under the root (started with --model-root)"
            )
        if os.path.exists(real) and not os.path.isdir(real):
            raise InvalidArgument(
                f"url {url} for model {name} is a file; POST /models loads a model directory (numeric "
                f"version dirs inside) under {self.model_root}: extract the archive there first"
            )
        return real

    def _check_links(self, name: str, url: str, dirs: list[str]) -> None:
        """Every file and dir under `dirs`, links followed, must resolve inside the model root."""
        seen: set[str] = set()
        stack: list[str] = []
        for shown in dirs:
            stack.append(self._inside_or_refuse(name, url, shown))
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            try:
                entries = list(os.scandir(current))
            except OSError as exc:
                raise PermissionDenied(f"cannot read {current} of model {name}: {exc.strerror}") from None
            for entry in entries:
                real = self._inside_or_refuse(name, url, entry.path)
                try:
                    mode = os.stat(real).st_mode
                except OSError:
                    raise PermissionDenied(
                        f"model {name} (url {url}) has {entry.path}, a broken link; remove or fix it"
                    ) from None
                if stat.S_ISDIR(mode):
                    stack.append(real)
                elif not stat.S_ISREG(mode):
                    raise PermissionDenied(
                        f"model {name} (url {url}) has {entry.path}, which is not a regular file "
                        "(a device, socket or pipe); remove it"
                    )

    def _inside_or_refuse(self, name: str, url: str, path: str) -> str:
        """realpath(`path`) if it lies inside the model root, else PermissionDenied naming the link
        (NotFound if a link under it changes while it is resolved: nothing is loaded from it)."""
        try:
            real = os.path.realpath(path)
        except OSError as exc:  # a link removed between realpath's lstat and its readlink
            raise NotFound(f"model {name} (url {url}): {path} changed while it was checked ({exc.strerror}); "
                           "load it again once its files stay put") from None
        if not within(real, self.model_root):
            raise PermissionDenied(
                f"model {name} (url {url}) has {path}, a link to {real}, outside the model root "
                f"{self.model_root}; copy the files into the model dir instead"
            )
        return real

    def _snapshot(self, name: str, url: str, path: str) -> str:
        """A private copy of the model dir at `path`, every file checked as it is read."""
        dest = os.path.join(self._snapshots, f"{name}-{uuid.uuid4().hex[:8]}")
        try:
            copy_confined(path, self.model_root, dest, model=name)
        except OSError as exc:
            raise ModelLoadError(
                f"could not copy model {name} (url {url}) to {dest} to load it: {exc.strerror}; "
                "set TMPDIR to a dir with room for the models"
            ) from None
        return dest

    def _check_memory(self, name: str, versions: dict[int, str]) -> None:
        """507 when size on disk × memory factor exceeds the memory available now."""
        if self.memory_factor <= 0:
            return
        on_disk = sum(tree_bytes(p) for p in versions.values())
        needed = math.ceil(on_disk * self.memory_factor)
        available = available_memory_bytes()
        if available is not None and needed > available:
            raise InsufficientMemory(
                f"Memory exhausted: model {name} needs about {needed / 2**20:.1f} MiB "
                f"({on_disk / 2**20:.1f} MiB on disk × {self.memory_factor:g}) but "
                f"{available / 2**20:.1f} MiB is available; unload a model (DELETE /models/NAME) "
                f"or use an instance with more memory"
            )

    def _load(self, name: str, url: str, source: ModelSource, policy: VersionPolicy | None = None, *,
              arrived: str = "the management API") -> None:
        """Load all versions (those `policy` selects); if any fails, unload the rest and report every failure."""
        self.service.mark_arrived(source.base_path, arrived)
        self.service.add_model(source, policy)
        served = self.service.manager.model(name)
        failed = [v for v in served.versions.values() if v.state is not State.AVAILABLE]
        if failed:
            self.service.remove_model(name)
            details = "; ".join(f"version {v.version}: {v.error}" for v in failed)
            raise ModelLoadError(f"Could not load model {name} from {url}: {details}")
        log.info("model %s loaded from %s (versions %s)", name, url, sorted(served.versions))


def parse_load_request(body: bytes) -> tuple[str, str]:
    """POST /models body → (model_name, url); InvalidArgument naming what is missing."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(
            f'Request body is not JSON ({exc}); send {{"model_name": "...", "url": "..."}}'
        ) from None
    if not isinstance(doc, dict):
        raise InvalidArgument('Request body must be a JSON object: {"model_name": "...", "url": "..."}')
    missing = [k for k in ("model_name", "url") if k not in doc]
    if missing:
        raise InvalidArgument(
            f"Request body is missing {' and '.join(repr(k) for k in missing)}; send "
            '{"model_name": "...", "url": "/opt/ml/models/..."}'
        )
    return doc["model_name"], doc["url"]


def _numeric_versions(path: str) -> dict[int, str]:
    """Numeric version subdirs only (a bare SavedModel dir is not a multi-model base path)."""
    return {v: p for v, p in discover_versions(path).items() if p != path}


def _port(base: str | None) -> str:
    return base.rsplit(":", 1)[-1] if base else "unknown"
