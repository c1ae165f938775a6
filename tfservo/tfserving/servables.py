"""The model manager: served models, their versions, labels and states (TF Serving's manager).

A version goes START → LOADING → AVAILABLE (or END with an error when loading fails) →
UNLOADING → END. Requests only ever reach AVAILABLE versions; a version that failed to load
is reported in status but never takes other versions or models down.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfservo.errors import InvalidArgument, ModelLoadError, NotFound
from tfservo.runtime.signatures import SignatureDef

log = logging.getLogger("tfservo.models")

Runner = Callable[[str, dict[str, np.ndarray], Sequence[str] | None], dict[str, np.ndarray]]


class State(enum.Enum):
    """TF Serving's ModelVersionStatus.State names."""

    START = "START"
    LOADING = "LOADING"
    AVAILABLE = "AVAILABLE"
    UNLOADING = "UNLOADING"
    END = "END"


@dataclass
class ServableVersion:
    """One loaded (or failed, or retired) version of a model."""

    model_name: str
    version: int
    path: str
    state: State = State.START
    error: str | None = None
    model: Any = None  # tfservo.runtime.savedmodel.LoadedModel once AVAILABLE
    runner: Runner | None = None
    load_seconds: float | None = None

    @property
    def signatures(self) -> dict[str, SignatureDef]:
        return self.model.signatures

    def signature(self, name: str) -> SignatureDef:
        """The signature called `name`, or InvalidArgument listing the ones there are."""
        sig = self.model.signatures.get(name)
        if sig is None:
            known = ", ".join(sorted(self.model.signatures)) or "none"
            raise InvalidArgument(
                f"Serving signature name: '{name}' not found in signature def of model "
                f"{self.model_name} version {self.version}; available signatures: {known}"
            )
        return sig

    def run(
        self,
        signature_name: str,
        inputs: dict[str, np.ndarray],
        output_keys: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run a signature through this version's runner (the batcher when batching is on)."""
        runner = self.runner or self.model.run
        return runner(signature_name, inputs, output_keys)


Loader = Callable[[str], Any]
RunnerFactory = Callable[[ServableVersion], Runner | None]


@dataclass
class ServedModel:
    """A model name with its versions and version labels."""

    name: str
    versions: dict[int, ServableVersion] = field(default_factory=dict)
    labels: dict[str, int] = field(default_factory=dict)

    def available(self) -> list[ServableVersion]:
        return [v for _, v in sorted(self.versions.items()) if v.state is State.AVAILABLE]


class ModelManager:
    """Loads model versions with a loader, tracks their state and resolves requests to them."""

    def __init__(
        self,
        loader: Loader,
        *,
        runner_factory: RunnerFactory | None = None,
        on_event: Callable[[ServableVersion], None] | None = None,
    ) -> None:
        self._loader = loader
        self._runner_factory = runner_factory
        self._on_event = on_event
        self._models: dict[str, ServedModel] = {}
        self._lock = threading.RLock()

    # -- loading ---------------------------------------------------------------------------

    def add_model(
        self,
        name: str,
        versions: Mapping[int, str],
        labels: Mapping[str, int] | None = None,
    ) -> ServedModel:
        """Serve `name` with the given versions (loading each); failures are recorded per version."""
        with self._lock:
            served = self._models.setdefault(name, ServedModel(name))
        for version, path in sorted(versions.items()):
            self.load_version(name, version, path)
        if labels:
            self.set_labels(name, labels)
        return served

    def load_version(self, name: str, version: int, path: str) -> ServableVersion:
        """Load one version; on failure the version ends in END with its error kept."""
        sv = ServableVersion(name, version, path, state=State.LOADING)
        with self._lock:
            served = self._models.setdefault(name, ServedModel(name))
            served.versions[version] = sv
        t0 = time.perf_counter()
        try:
            sv.model = self._loader(path)
        except ModelLoadError as exc:
            sv.state, sv.error = State.END, exc.message
            log.error("model %s version %d failed to load: %s", name, version, exc.message)
        except Exception as exc:  # a loader bug must not take the server down either
            sv.state, sv.error = State.END, f"{type(exc).__name__}: {exc}"
            log.exception("model %s version %d failed to load", name, version)
        else:
            sv.load_seconds = time.perf_counter() - t0
            if self._runner_factory is not None:
                sv.runner = self._runner_factory(sv)
            sv.state = State.AVAILABLE
            log.info(
                "model %s version %d AVAILABLE from %s (%.2fs)", name, version, path, sv.load_seconds
            )
        if self._on_event:
            self._on_event(sv)
        return sv

    def unload_version(self, name: str, version: int) -> None:
        """Stop serving one version and free it."""
        with self._lock:
            served = self._models.get(name)
            sv = served.versions.get(version) if served else None
            if sv is None:
                return
            sv.state = State.UNLOADING
        close = getattr(sv.runner, "close", None)
        if close:
            close()
        if sv.model is not None:
            sv.model.close()
        sv.state = State.END
        log.info("model %s version %d unloaded", name, version)
        if self._on_event:
            self._on_event(sv)

    def remove_model(self, name: str) -> None:
        """Unload every version of `name` and forget it."""
        with self._lock:
            served = self._models.get(name)
            if served is None:
                raise NotFound(f"Model {name} is not loaded yet.")
        for version in list(served.versions):
            self.unload_version(name, version)
        with self._lock:
            self._models.pop(name, None)

    def set_labels(self, name: str, labels: Mapping[str, int]) -> None:
        """Assign version labels; each must point at a version of the model."""
        served = self.model(name)
        for label, version in labels.items():
            if version not in served.versions:
                raise InvalidArgument(
                    f"version label {label!r} of model {name} points at version {version}, "
                    f"which is not served; versions: {sorted(served.versions)}"
                )
            served.labels[label] = version

    def close(self) -> None:
        for name in list(self._models):
            self.remove_model(name)

    # -- lookup ----------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        with self._lock:
            return sorted(self._models)

    def models(self) -> Iterable[ServedModel]:
        with self._lock:
            return [self._models[n] for n in sorted(self._models)]

    def model(self, name: str) -> ServedModel:
        with self._lock:
            served = self._models.get(name)
        if served is None:
            raise NotFound(f"Servable not found for request: Latest({name})")
        return served

    def resolve(
        self, name: str, version: int | None = None, label: str | None = None
    ) -> ServableVersion:
        """The AVAILABLE version a request names (latest when none), as TF Serving resolves it."""
        served = self.model(name)
        if label is not None:
            if label not in served.labels:
                raise NotFound(
                    f"Unrecognized servable version label: {label} for model {name}; "
                    f"labels: {sorted(served.labels) or 'none'}"
                )
            version = served.labels[label]
        if version is None:
            available = served.available()
            if not available:
                raise NotFound(_no_version_message(served))
            return available[-1]
        sv = served.versions.get(version)
        if sv is None or sv.state is not State.AVAILABLE:
            raise NotFound(f"Servable not found for request: Specific({name}, {version})")
        return sv


def _no_version_message(served: ServedModel) -> str:
    errors = [f"version {v.version}: {v.error}" for v in served.versions.values() if v.error]
    detail = "; ".join(errors) if errors else "no version has finished loading"
    return f"Model {served.name} has no available version ({detail})"
