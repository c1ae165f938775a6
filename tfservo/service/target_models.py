"""Multi-model endpoints as SageMaker runs them: `X-Amzn-SageMaker-Target-Model: a/model.tar.gz`
loads that archive from the model root on its first request and keeps it, least recently used
models making room when memory runs short.

SageMaker's platform does this outside the container (it downloads the archive, then calls
the container's POST /models); here one `TargetModels` does it in the process. The archive is
read only from under the model root: a local one through a checked descriptor into a private
copy (as `/models` loads are), an `s3://` one by key under the root's prefix; extraction is
held to the archive limits. Concurrent first requests for one target load it once.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import shutil
import threading
from collections import OrderedDict
from concurrent.futures import Future

from tfservo.core.archive_limits import ArchiveLimits
from tfservo.core.errors import (
    BundleError,
    BundleNotFound,
    InsufficientMemory,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ServingError,
)
from tfservo.core.memory import available_memory_bytes, tree_bytes
from tfservo.models.bundle import ModelSource, open_bundle
from tfservo.models.snapshot import copy_file_confined
from tfservo.service.multi_model import MultiModelEndpoint

__all__ = ["TargetModels", "target_model_name"]

log = logging.getLogger("tfservo.multi_model")

_MAX_TARGET = 1024  # SageMaker's bound on X-Amzn-SageMaker-Target-Model
_PRINTABLE = re.compile(r"\S[\x20-\x7e]*")


def target_model_name(target: str) -> str:
    """The model name a target archive is served under: readable, unique per target."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", target.removesuffix(".tar.gz")).strip("._-")[:120] or "model"
    return f"{stem}-{hashlib.sha256(target.encode()).hexdigest()[:8]}"


class TargetModels:
    """Targets loaded on first use, kept in least-recently-used order.

    `memory_budget_bytes` bounds the estimated memory of the loaded targets (size on disk ×
    the endpoint's memory factor); memory available on the machine bounds it too. A load that
    would pass either unloads the least recently used targets first; 507 only when the one
    model alone does not fit.
    """

    def __init__(
        self,
        endpoint: MultiModelEndpoint,
        *,
        memory_budget_bytes: int | None = None,
        archive_limits: ArchiveLimits | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.memory_budget_bytes = memory_budget_bytes
        self.archive_limits = archive_limits or ArchiveLimits()
        self._loaded: OrderedDict[str, int] = OrderedDict()  # name → estimated bytes, LRU first
        self._loading: dict[str, Future[str]] = {}
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()  # one load or eviction at a time: memory is shared
        self.loads = 0  # archives loaded (a reload after an eviction counts again)
        self.evictions = 0

    def resolve(self, target: str) -> str:
        """The model name serving `target`, loading the archive if this is its first use."""
        check_target(target)
        name = target_model_name(target)
        with self._lock:
            if name in self._loaded:
                self._loaded.move_to_end(name)
                return name
            pending = self._loading.get(name)
            owner = pending is None
            if owner:
                pending = self._loading[name] = Future()
        assert pending is not None
        if not owner:
            return pending.result()  # raises what the loading request raised
        try:
            self._load(target, name)
            pending.set_result(name)
            return name
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._loading.pop(name, None)

    def loaded_name(self, target: str) -> str | None:
        """The model name of `target` if it is loaded (marking it used), else None: no I/O."""
        name = target_model_name(target)
        with self._lock:
            if name not in self._loaded:
                return None
            self._loaded.move_to_end(name)
            return name

    def loaded(self) -> list[str]:
        """Loaded target models, least recently used first."""
        with self._lock:
            return list(self._loaded)

    def _load(self, target: str, name: str) -> None:
        with self._load_lock:
            private = self.endpoint.private_dir(name)
            try:
                source = self._extract(target, name, private)
            except BaseException:
                shutil.rmtree(private, ignore_errors=True)
                raise
            estimate = math.ceil(sum(tree_bytes(p) for p in source.versions.values()) * self.endpoint.memory_factor)
            self._make_room(name, target, estimate)
            self.endpoint.load_private(name, target, source, private)
            with self._lock:
                self._loaded[name] = estimate
            self.loads += 1
            log.info("target model %s loaded as %s (about %.1f MiB)", target, name, estimate / 2**20)

    def _extract(self, target: str, name: str, private: str) -> ModelSource:
        """The one model of archive `target` under the root, extracted into `private`."""
        root = self.endpoint.model_root
        if self.endpoint.remote_root:
            archive = root + target
        else:
            archive = os.path.join(private, "model.tar.gz")
            try:
                copy_file_confined(os.path.join(root, target), root, archive, model=target)
            except FileNotFoundError:
                raise NotFound(_missing(target, os.path.join(root, target), root, _archives_in(root))) from None
        try:
            bundle = open_bundle(archive, cache_dir=os.path.join(private, "x"), limits=self.archive_limits)
        except BundleNotFound:
            raise NotFound(_missing(target, archive, root, None)) from None
        except BundleError as exc:
            raise InvalidArgument(f"target model {target} cannot be loaded: {exc}") from None
        finally:
            if not self.endpoint.remote_root and os.path.exists(archive):
                os.remove(archive)  # extracted: the archive itself is not needed any more
        if len(bundle.models) != 1:
            raise InvalidArgument(
                f"target model {target} holds {len(bundle.models)} models ({', '.join(bundle.models) or 'none'}); "
                "a multi-model archive holds one model: numbered SavedModel version dirs and an optional code/"
            )
        [model] = bundle.models.values()
        return ModelSource(name, model.base_path, model.versions, model.code_dir or bundle.code_dir)

    def _make_room(self, name: str, target: str, estimate: int) -> None:
        """Unload least recently used targets until `estimate` fits; 507 if it never will."""
        while True:
            with self._lock:
                held = sum(self._loaded.values())
                victims = list(self._loaded)
            available = available_memory_bytes() if self.endpoint.memory_factor > 0 else None
            over_budget = self.memory_budget_bytes is not None and held + estimate > self.memory_budget_bytes
            short = available is not None and estimate > available
            if not over_budget and not short:
                return
            if not victims:
                if over_budget and self.memory_budget_bytes is not None:
                    bound = f"the budget of {self.memory_budget_bytes / 2**20:.1f} MiB (TFSERVO_MME_MEMORY_MB)"
                else:
                    bound = f"the {(available or 0) / 2**20:.1f} MiB available"
                raise InsufficientMemory(
                    f"Memory exhausted: target model {target} needs about {estimate / 2**20:.1f} MiB, more than "
                    f"{bound} with no other model loaded; use an instance with more memory"
                )
            self._evict(victims[0])

    def _evict(self, name: str) -> None:
        with self._lock:
            self._loaded.pop(name, None)
        try:
            self.endpoint.unload(name)
        except ServingError as exc:  # unloaded meanwhile through DELETE /models/NAME
            log.info("evicting %s: %s", name, exc)
        self.evictions += 1
        log.info("target model %s unloaded to make room (least recently used)", name)


def check_target(target: str) -> None:
    """SageMaker's rules for X-Amzn-SageMaker-Target-Model, and no way out of the root."""
    if not target or len(target) > _MAX_TARGET or not _PRINTABLE.fullmatch(target):
        raise InvalidArgument(
            f"X-Amzn-SageMaker-Target-Model {target[:80]!r} is not valid: 1 to {_MAX_TARGET} printable "
            "characters, not starting with a space, naming an archive under the model root (e.g. a/model.tar.gz)"
        )
    parts = target.replace("\\", "/").split("/")
    if target.startswith("/") or "://" in target or ".." in parts:
        raise PermissionDenied(
            f"X-Amzn-SageMaker-Target-Model {target!r} must be a relative path under the model root, "
            "without '..' or a scheme"
        )


def _missing(target: str, archive: str, root: str, present: list[str] | None) -> str:
    """What a target model that is not there is missing, and what the model root holds instead."""
    message = (f"target model {target} not found: there is no {archive} (the model root {root} joined with "
               f"X-Amzn-SageMaker-Target-Model); copy the archive there or check the header")
    if present is not None:
        shown = ", ".join(present[:10]) + (f" and {len(present) - 10} more" if len(present) > 10 else "")
        message += f"; the model root holds {shown or 'no archives'}"
    return message


def _archives_in(root: str) -> list[str]:
    """The archives directly under a local model root, by name (for an error message)."""
    try:
        return sorted(e.name for e in os.scandir(root) if e.is_file() and e.name.endswith((".tar.gz", ".tgz", ".tar")))
    except OSError:
        return []
