"""Which versions of each model are served, and following the disk as versions come and go.

Each watched model has a base path and a version policy. `sync` compares the numeric version
dirs on disk with what is served: new wanted versions are loaded (and warmed up) first, and
only once one of the wanted versions is AVAILABLE are the unwanted ones unloaded, after their
in-flight calls finish (TF Serving's availability-preserving policy). A version dir becomes
visible under its numeric name only when complete (copy under a temporary name, then rename),
so a new numeric name is all the poller looks for. With `start_polling(seconds)` a thread
runs `sync` for every model (TF Serving's --file_system_poll_wait_seconds).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from tfservo.core.errors import InvalidArgument, NotFound
from tfservo.models.bundle import discover_versions
from tfservo.models.model_config import VersionPolicy
from tfservo.models.profiling import annotation
from tfservo.models.servables import ModelManager, ServedModel, State

__all__ = ["ModelLifecycle", "WatchedModel"]

log = logging.getLogger("tfservo.lifecycle")


@dataclass
class WatchedModel:
    """A model whose versions follow its base path under a policy."""

    name: str
    base_path: str
    policy: VersionPolicy
    labels: dict[str, int] = field(default_factory=dict)
    # version → fingerprint of the dir that failed to load; retried only when the dir changes
    failed: dict[int, tuple[int, int]] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class ModelLifecycle:
    """Loads and retires model versions per policy; optionally polls the file system."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        self._watched: dict[str, WatchedModel] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- models ------------------------------------------------------------------------------

    def watch(
        self,
        name: str,
        base_path: str,
        policy: VersionPolicy,
        labels: Mapping[str, int] | None = None,
        versions: Mapping[int, str] | None = None,
    ) -> ServedModel:
        """Serve `name` from `base_path`: load the versions the policy selects, then set labels.

        `versions` (number → dir) is what the caller already found on disk; by default the
        numeric dirs of `base_path` are scanned. Load failures are kept per version (see
        GET /v1/models/NAME); a label naming a version that is not AVAILABLE is InvalidArgument.
        """
        entry = WatchedModel(name, base_path, policy, dict(labels or {}))
        with self._lock:
            if name in self._watched:
                raise InvalidArgument(
                    f"Model {name} is already served (from {self._watched[name].base_path})"
                )
            self._watched[name] = entry
        self.manager.add_model(name, {})
        try:
            self.sync(name, versions)
            self._apply_labels(entry)
        except Exception:
            self.unwatch(name)
            raise
        return self.manager.model(name)

    def update(
        self, name: str, policy: VersionPolicy, labels: Mapping[str, int] | None = None
    ) -> None:
        """Change a watched model's policy and labels (a config reload), then sync it."""
        entry = self._entry(name)
        entry.policy = policy
        entry.labels = dict(labels or {})
        self.sync(name)
        self._apply_labels(entry)

    def unwatch(self, name: str) -> None:
        """Stop following `name` and unload it (NotFound if it is not served)."""
        with self._lock:
            self._watched.pop(name, None)
        self.manager.remove_model(name)

    def watched(self) -> dict[str, WatchedModel]:
        with self._lock:
            return dict(self._watched)

    # -- syncing -----------------------------------------------------------------------------

    def sync(self, name: str, versions: Mapping[int, str] | None = None) -> None:
        """Bring `name`'s served versions in line with its base path and policy."""
        entry = self._entry(name)
        with entry.lock:
            found = dict(versions) if versions is not None else self._scan(entry)
            if found is None:
                return
            wanted = entry.policy.select(found)
            if found and not wanted:
                self._warn_once(
                    entry, f"policy:{sorted(found)}",
                    "model %s: none of the versions %s under %s is selected by policy %s",
                    name, sorted(found), entry.base_path, entry.policy,
                )
            served = self.manager.model(name)
            for version in sorted(wanted):
                self._load_if_needed(entry, served, version, found[version])
            self._retire(entry, served, wanted)

    def _scan(self, entry: WatchedModel) -> dict[int, str] | None:
        if not os.path.isdir(entry.base_path):
            self._warn_once(
                entry, "missing", "model %s: base path %s is missing; keeping the versions served",
                entry.name, entry.base_path,
            )
            return None
        entry.warned.discard("missing")
        return discover_versions(entry.base_path)

    def _load_if_needed(self, entry: WatchedModel, served: ServedModel, version: int, path: str) -> None:
        sv = served.versions.get(version)
        if sv is not None and sv.state in (State.LOADING, State.AVAILABLE):
            return
        fingerprint = _fingerprint(path)
        if sv is not None and sv.error and entry.failed.get(version) == fingerprint:
            return  # failed before and the dir is unchanged: don't retry every poll
        loaded = self.manager.load_version(entry.name, version, path)
        if loaded.state is State.AVAILABLE:
            entry.failed.pop(version, None)
        else:
            entry.failed[version] = fingerprint

    def _retire(self, entry: WatchedModel, served: ServedModel, wanted: set[int]) -> None:
        retired = [
            v for v, sv in sorted(served.versions.items())
            if v not in wanted and sv.state is State.AVAILABLE
        ]
        if not retired:
            return
        if not any(v.version in wanted for v in served.available()):
            self._warn_once(
                entry, f"keep:{retired}",
                "model %s: keeping version(s) %s: none of the wanted versions %s is AVAILABLE",
                entry.name, retired, sorted(wanted),
            )
            return
        for version in retired:
            log.info("model %s: retiring version %d (policy %s)", entry.name, version, entry.policy)
            self.manager.unload_version(entry.name, version)

    def _apply_labels(self, entry: WatchedModel) -> None:
        served = self.manager.model(entry.name)
        for label, version in entry.labels.items():
            sv = served.versions.get(version)
            if sv is None or sv.state is not State.AVAILABLE:
                detail = f" ({sv.error})" if sv is not None and sv.error else ""
                raise InvalidArgument(
                    f"version label {label!r} of model {entry.name} points at version {version}, "
                    f"which is not AVAILABLE{detail}; AVAILABLE versions: "
                    f"{[v.version for v in served.available()] or 'none'}"
                )
        served.labels = dict(entry.labels)  # one assignment: requests see old or new labels

    def _entry(self, name: str) -> WatchedModel:
        with self._lock:
            entry = self._watched.get(name)
        if entry is None:
            known = ", ".join(sorted(self._watched)) or "none"
            raise NotFound(f"Model {name} is not served; models: {known}")
        return entry

    def _warn_once(self, entry: WatchedModel, key: str, msg: str, *args: object) -> None:
        if key not in entry.warned:
            entry.warned.add(key)
            log.warning(msg, *args)

    # -- polling -----------------------------------------------------------------------------

    def poll_once(self) -> None:
        """Sync every watched model; one model's failure is logged and does not stop the rest."""
        for name in list(self.watched()):
            if self._stop.is_set():
                return
            try:
                with annotation("tfservo.poll_base_path", model=name):
                    self.sync(name)
            except NotFound:
                pass  # removed while we were polling
            except Exception:
                log.exception("model %s: polling its base path failed", name)

    def start_polling(self, seconds: float) -> None:
        """Sync every `seconds` in a background thread (TF Serving's --file_system_poll_wait_seconds)."""
        if seconds <= 0 or self._thread is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(seconds):
                self.poll_once()

        self._thread = threading.Thread(target=loop, name="tfservo-fs-poll", daemon=True)
        self._thread.start()
        log.info("polling model base paths every %gs for new versions", seconds)

    def stop(self) -> None:
        """Stop polling (a sync in progress finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None


def _fingerprint(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0)
    return (st.st_ino, st.st_mtime_ns)
