"""The model manager: served models, their versions, labels and states (TF Serving's manager).

A version goes START → LOADING → AVAILABLE (or END with an error when loading fails) →
UNLOADING → END. Requests only ever reach AVAILABLE versions; a version that failed to load
is reported in status but never takes other versions or models down.
"""

from __future__ import annotations

import difflib
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tfservo.core import tracing
from tfservo.core.errors import Code, InvalidArgument, ModelLoadError, NotFound, ServingError, Unavailable
from tfservo.core.request_labels import note_model, note_version
from tfservo.models.signatures import Runner, SignatureDef

if TYPE_CHECKING:
    from tfservo.models.savedmodel import LoadedModel

__all__ = ["ModelManager", "Runner", "RunnerFactory", "ServableHandle", "ServableVersion", "ServedModel", "State"]

log = logging.getLogger("tfservo.models")



class State(enum.Enum):
    """TF Serving's ModelVersionStatus.State names."""

    START = "START"
    LOADING = "LOADING"
    AVAILABLE = "AVAILABLE"
    UNLOADING = "UNLOADING"
    END = "END"


@dataclass(eq=False)
class ServableVersion:
    """One loaded (or failed, or retired) version of a model.

    Calls reach it through a ServableHandle (`ModelManager.acquire`): an unload waits until
    every handle taken before it is released, so a request that picked this version finishes
    on it.
    """

    model_name: str
    version: int
    path: str
    state: State = State.START
    error: str | None = None
    error_code: Code = Code.OK  # the load or warmup error's own code, as TF Serving reports it
    model: LoadedModel | None = None  # set once loaded
    runner: Runner | None = None  # the batcher when batching is on
    load_seconds: float | None = None
    on_run: Callable[[str, float], None] | None = field(default=None, repr=False)  # unbatched call timings
    on_hold: Callable[[str, int], None] | None = field(default=None, repr=False)  # handles taken/given back
    refs: int = field(default=0, repr=False)  # handles held now
    _calls: threading.Condition = field(default_factory=threading.Condition, repr=False)

    @property
    def loaded(self) -> LoadedModel:
        """The loaded model; Unavailable once the version has been unloaded."""
        model = self.model
        if model is None or self.state is State.END:
            raise Unavailable(
                f"Model {self.model_name} version {self.version} was unloaded before this "
                "request reached it; retry the request"
            )
        return model

    @property
    def signatures(self) -> dict[str, SignatureDef]:
        return self.loaded.signatures

    def signature(self, name: str) -> SignatureDef:
        """The signature called `name`, or InvalidArgument listing the ones there are."""
        sig = self.loaded.signatures.get(name)
        if sig is None:
            known = ", ".join(sorted(self.loaded.signatures)) or "none"
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
        if tracing.enabled():
            with tracing.span("model", self.span_attributes(signature_name)):
                return self._run(signature_name, inputs, output_keys)
        return self._run(signature_name, inputs, output_keys)

    def span_attributes(self, signature_name: str) -> dict[str, Any]:
        """The "model" span's attributes for a call of this version (the batcher's spans too)."""
        return {"tfservo.model.name": self.model_name, "tfservo.model.version": self.version,
                "tfservo.model.signature": signature_name, "tfservo.batched": self.runner is not None}

    def _run(
        self, signature_name: str, inputs: dict[str, np.ndarray], output_keys: Sequence[str] | None
    ) -> dict[str, np.ndarray]:
        if self.runner is not None:
            return self.runner(signature_name, inputs, output_keys)
        if self.on_run is None:
            return self.loaded.run(signature_name, inputs, output_keys)
        started = time.perf_counter()
        try:
            return self.loaded.run(signature_name, inputs, output_keys)
        finally:
            self.on_run(self.model_name, time.perf_counter() - started)

    def submit(
        self,
        signature_name: str,
        inputs: dict[str, np.ndarray],
        output_keys: Sequence[str] | None,
        callback: Callable[[dict[str, np.ndarray] | None, BaseException | None], None],
        *,
        here: object | None = None,
    ) -> bool:
        """Queue a call on this version's batcher without waiting (see Batcher.submit; `here`:
        the caller's event loop's LoopBatches, where a quick model's calls are batched; passed on
        as it is, so this module needs no batching).

        False, with nothing queued, when the call has to go through `run` instead: no batcher,
        or a call the batcher only takes blocking.
        """
        submit = getattr(self.runner, "submit", None)
        if submit is None:
            return False
        self.loaded  # noqa: B018 - refuses a version that is gone
        return bool(submit(signature_name, inputs, output_keys, callback, here=here))

    def run_lone(
        self, signature_name: str, inputs: dict[str, np.ndarray], output_keys: Sequence[str] | None,
        here: object,
    ) -> dict[str, np.ndarray] | None:
        """A lone call's outputs, run at once when this version's batcher allows it (see
        Batcher.run_lone); None: `submit` it instead."""
        run_lone = getattr(self.runner, "run_lone", None)
        if run_lone is None:
            return None
        self.loaded  # noqa: B018 - refuses a version that is gone
        outputs: dict[str, np.ndarray] | None = run_lone(signature_name, inputs, output_keys, here)
        return outputs

    def _take(self) -> bool:
        """One more handle, if the version still takes requests (AVAILABLE)."""
        with self._calls:
            if self.state is not State.AVAILABLE:
                return False
            self.refs += 1
        if self.on_hold is not None:
            self.on_hold(self.model_name, 1)
        return True

    def _give_back(self) -> None:
        with self._calls:
            self.refs -= 1
            self._calls.notify_all()
        if self.on_hold is not None:
            self.on_hold(self.model_name, -1)

    def drain(self, timeout: float) -> bool:
        """Wait until every handle is released; False if some are still held after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._calls:
            while self.refs > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._calls.wait(left)
            return True


class ServableHandle:
    """A reference to one AVAILABLE version for the length of one call (TF Serving's
    ServableHandle): `with manager.acquire(...) as sv:`, or `release()` when the call ends
    elsewhere (an answer delivered from a batch thread)."""

    __slots__ = ("servable", "_released")

    def __init__(self, servable: ServableVersion) -> None:
        self.servable = servable
        self._released = False

    def release(self) -> None:
        """Give the reference back (once; later calls do nothing)."""
        if not self._released:
            self._released = True
            self.servable._give_back()

    def __enter__(self) -> ServableVersion:
        return self.servable

    def __exit__(self, *exc: object) -> None:
        self.release()


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

    def labelled(self, label: str) -> int:
        """The version `label` points at, or NotFound listing the labels there are."""
        if label not in self.labels:
            raise NotFound(
                f"Unrecognized servable version label: {label} for model {self.name}; "
                f"labels: {sorted(self.labels) or 'none'}"
            )
        return self.labels[label]


class ModelManager:
    """Loads model versions with a loader, tracks their state and resolves requests to them."""

    def __init__(
        self,
        loader: Loader,
        *,
        runner_factory: RunnerFactory | None = None,
        on_event: Callable[[ServableVersion], None] | None = None,
        on_run: Callable[[str, float], None] | None = None,
        on_hold: Callable[[str, int], None] | None = None,
        warmup: Callable[[ServableVersion], object] | None = None,
        drain_timeout_seconds: float = 60.0,
    ) -> None:
        self._loader = loader
        self._runner_factory = runner_factory
        self._on_event = on_event
        self._on_run = on_run
        self._on_hold = on_hold
        self.warmup = warmup  # runs between load and AVAILABLE; raising fails the version
        self.drain_timeout_seconds = drain_timeout_seconds
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
        sv = ServableVersion(name, version, path, state=State.LOADING, on_run=self._on_run,
                             on_hold=self._on_hold)
        with self._lock:
            served = self._models.setdefault(name, ServedModel(name))
            served.versions[version] = sv
        t0 = time.perf_counter()
        try:
            sv.model = self._loader(path)
        except ModelLoadError as exc:
            sv.state, sv.error, sv.error_code = State.END, exc.message, exc.code
            log.error("model %s version %d failed to load: %s", name, version, exc.message)
        except Exception as exc:  # a loader bug must not take the server down either
            sv.state, sv.error, sv.error_code = State.END, f"{type(exc).__name__}: {exc}", Code.UNKNOWN
            log.exception("model %s version %d failed to load", name, version)
        else:
            if reason := getattr(sv.model, "fallback_reason", None):
                log.warning(
                    "model %s version %d runs through tf.saved_model.load, not a Session (slower): %s",
                    name, version, reason,
                )
            if self._runner_factory is not None:
                sv.runner = self._runner_factory(sv)
            if self._warm_up(sv):
                sv.load_seconds = time.perf_counter() - t0
                sv.state = State.AVAILABLE
                log.info(
                    "model %s version %d AVAILABLE from %s (%.2fs)", name, version, path, sv.load_seconds
                )
        if self._on_event:
            self._on_event(sv)
        return sv

    def _warm_up(self, sv: ServableVersion) -> bool:
        """Replay the version's warmup requests; on failure free it and record why (END)."""
        if self.warmup is None:
            return True
        try:
            self.warmup(sv)
        except Exception as exc:
            if isinstance(exc, ServingError):
                code, message = exc.code, exc.message
            else:
                code, message = Code.UNKNOWN, f"{type(exc).__name__}: {exc}"
            sv.state, sv.error, sv.error_code = State.END, message, code
            log.error("model %s version %d failed warmup: %s", sv.model_name, sv.version, message)
            self._release(sv)
            return False
        return True

    @staticmethod
    def _release(sv: ServableVersion) -> None:
        close = getattr(sv.runner, "close", None)
        if close:
            close()
        if sv.model is not None:
            sv.model.close()

    def unload_version(self, name: str, version: int) -> None:
        """Stop serving one version and free it."""
        with self._lock:
            served = self._models.get(name)
            sv = served.versions.get(version) if served else None
            if sv is None:
                return
            if sv.state is State.END:
                return
            with sv._calls:  # from here on acquire() skips it; handles already taken finish
                sv.state = State.UNLOADING
        if not sv.drain(self.drain_timeout_seconds):
            log.warning(
                "model %s version %d: %d call(s) still running after %.0fs; unloading anyway",
                name, version, sv.refs, self.drain_timeout_seconds,
            )
        with sv._calls:
            sv.state = State.END  # from here on run() refuses instead of touching a closed model
        self._release(sv)
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

    def has_model(self, name: str) -> bool:
        with self._lock:
            return name in self._models

    def models(self) -> Iterable[ServedModel]:
        with self._lock:
            return [self._models[n] for n in sorted(self._models)]

    def model(self, name: str) -> ServedModel:
        with self._lock:
            served = self._models.get(name)
            names = sorted(self._models) if served is None else []
        if served is None:
            raise NotFound(f"Servable not found for request: Latest({name}); {_served_names(name, names)}")
        note_model(name)
        return served

    def resolve(
        self, name: str, version: int | None = None, label: str | None = None
    ) -> ServableVersion:
        """The AVAILABLE version a request names (latest when none), as TF Serving resolves it.

        For looking a version up (metadata, status, a pipeline's choice of version); a call
        that runs the model takes a handle with `acquire` instead."""
        return self._find(name, version, label, take=False)

    def acquire(self, name: str, version: int | None = None, label: str | None = None) -> ServableHandle:
        """A handle on the version a request names (latest AVAILABLE when none), held for one call."""
        return ServableHandle(self._find(name, version, label, take=True))

    def _find(self, name: str, version: int | None, label: str | None, *, take: bool) -> ServableVersion:
        served = self.model(name)
        if label is not None:
            version = served.labelled(label)
        if version is None:
            for sv in reversed(served.available()):
                if not take or sv._take():
                    note_version(name, sv.version)
                    return sv
            raise NotFound(_no_version_message(served))
        found = served.versions.get(version)
        if found is None or found.state is not State.AVAILABLE or (take and not found._take()):
            raise NotFound(f"Servable not found for request: Specific({name}, {version})")
        note_version(name, found.version)
        return found


def _served_names(name: str, names: list[str]) -> str:
    """What the server does serve, and the closest name to the one asked for."""
    if not names:
        return "no model is served"
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    listed = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return f"models served: {listed}" + (f" (did you mean {close[0]!r}?)" if close else "")


def _no_version_message(served: ServedModel) -> str:
    errors = [f"version {v.version}: {v.error}" for v in served.versions.values() if v.error]
    detail = "; ".join(errors) if errors else "no version has finished loading"
    return f"Model {served.name} has no available version ({detail})"
