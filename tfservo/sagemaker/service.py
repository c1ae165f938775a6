"""Assembles a bundle into a running service: models loaded, handlers ready, one Invoker.

The HTTP server, `tfservo invoke`, the transform engine and the Beam handler each build a
ModelService and call the same objects, so every mode behaves the same.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tfservo.bundle import Bundle, ModelSource, open_bundle
from tfservo.errors import BundleError
from tfservo.sagemaker.handlers import Handlers, install_requirements, load_handlers
from tfservo.sagemaker.invocation import Invoker
from tfservo.tfserving.api import TFServingAPI
from tfservo.tfserving.lifecycle import ModelLifecycle
from tfservo.tfserving.model_config import VersionPolicy
from tfservo.tfserving.servables import ModelManager, RunnerFactory, ServableVersion
from tfservo.tfserving.warmup import replay_warmup

log = logging.getLogger("tfservo.service")


@dataclass
class ServiceOptions:
    """How models are loaded and which model answers by default."""

    intra_op_threads: int = 0
    inter_op_threads: int = 0
    version_labels: dict[str, dict[str, int]] = field(default_factory=dict)
    default_model_name: str | None = None
    runner_factory: RunnerFactory | None = None
    on_event: Callable[[ServableVersion], None] | None = None
    requirements_dir: str | None = None
    multi_model: bool = False  # SageMaker multi-model mode: no default model, /ping = "up"


class ModelService:
    """Models, handlers, the TF Serving API and the invocation path of one or more bundles."""

    def __init__(self, options: ServiceOptions | None = None) -> None:
        self.options = options or ServiceOptions()
        loader = functools.partial(
            _load_saved_model,
            intra=self.options.intra_op_threads,
            inter=self.options.inter_op_threads,
        )
        self.manager = ModelManager(
            loader,
            runner_factory=self.options.runner_factory,
            on_event=self.options.on_event,
            warmup=lambda sv: replay_warmup(self.api, sv),
        )
        self.api = TFServingAPI(self.manager)
        self.lifecycle = ModelLifecycle(self.manager)
        self.bundles: list[Bundle] = []
        self.configured_models: list[str] = []
        self.rest_base: str | None = None
        self.grpc_port: int | None = None
        self.invoker = Invoker(
            self.api,
            default_model=self.default_model,
            rest_base=lambda: self.rest_base or "http://127.0.0.1:8080",
            grpc_port=lambda: self.grpc_port,
        )

    @property
    def batches(self) -> bool:
        """Whether model calls go through batchers (and so may wait for their batch)."""
        return self.options.runner_factory is not None

    # -- building ----------------------------------------------------------------------------

    def add_bundle(self, path_or_url: str) -> Bundle:
        """Open a bundle, prepare its code and load every model in it."""
        bundle = open_bundle(path_or_url)
        if bundle.code_dir:
            self.invoker.universal_handlers = self._prepare_code(bundle.code_dir, "universal")
        for source in bundle.models.values():
            self.add_model(source)
        self.bundles.append(bundle)
        return bundle

    def add_model(
        self,
        source: ModelSource,
        policy: VersionPolicy | None = None,
        labels: Mapping[str, int] | None = None,
    ) -> None:
        """Load one model's versions (all of them unless `policy` says otherwise) and its own code/."""
        if source.name in self.manager.model_names():
            raise BundleError(
                f"Model name {source.name} appears twice (again in {source.base_path}); "
                "rename one of the model dirs"
            )
        if source.code_dir:
            handlers = self._prepare_code(source.code_dir, source.name)
            if handlers is not None:
                self.invoker.handlers[source.name] = handlers
        if labels is None:
            labels = self.options.version_labels.get(source.name)
        try:
            self.lifecycle.watch(
                source.name, source.base_path, policy or VersionPolicy.all(), labels, source.versions
            )
        except Exception:
            self.invoker.handlers.pop(source.name, None)
            raise
        self.configured_models.append(source.name)

    def set_universal_code(self, code_dir: str) -> None:
        """Use `code_dir`/inference.py for every model without its own code/."""
        self.invoker.universal_handlers = self._prepare_code(code_dir, "universal")

    @functools.cached_property
    def model_config(self):  # -> tfservo.sagemaker.model_config_reloader.ModelConfigReloader
        """Models from TF Serving's model config file; `reload_config` swaps the whole list."""
        from tfservo.sagemaker.model_config_reloader import ModelConfigReloader

        return ModelConfigReloader(self)

    def remove_model(self, name: str) -> None:
        self.lifecycle.unwatch(name)
        self.invoker.handlers.pop(name, None)
        if name in self.configured_models:
            self.configured_models.remove(name)

    def _prepare_code(self, code_dir: str, label: str) -> Handlers | None:
        target = os.path.join(
            self.options.requirements_dir or os.path.join(tempfile.gettempdir(), "tfservo-requirements"),
            # keyed by what is installed, so a re-extracted archive reuses its earlier install
            hashlib.sha256(label.encode() + _read_or_empty(os.path.join(code_dir, "requirements.txt"))).hexdigest()[:16],
        )
        install_requirements(code_dir, target)
        module = f"tfservo_user_inference_{label.replace('.', '_').replace('-', '_')}"
        return load_handlers(code_dir, module_name=module)

    # -- queries -----------------------------------------------------------------------------

    def default_model(self) -> str | None:
        """SAGEMAKER_TFS_DEFAULT_MODEL_NAME (or --default-model), else the first model by name."""
        if self.options.default_model_name:
            return self.options.default_model_name
        if self.options.multi_model:
            return None  # a multi-model endpoint has no default: requests must name the model
        names = self.manager.model_names()
        return names[0] if names else None

    def is_healthy(self) -> bool:
        """Every configured model has at least one AVAILABLE version (multi-model mode: always)."""
        return not self.unavailable_models()

    def unavailable_models(self) -> list[str]:
        """Configured models without an AVAILABLE version (none in multi-model mode)."""
        if self.options.multi_model:
            return []
        served = {m.name: m for m in self.manager.models()}
        return [name for name in self.configured_models if name not in served or not served[name].available()]

    def close(self) -> None:
        self.lifecycle.stop()
        self.manager.close()


def _load_saved_model(path: str, *, intra: int, inter: int):
    from tfservo.runtime.savedmodel import load_saved_model

    return load_saved_model(path, intra_op_threads=intra, inter_op_threads=inter)


def parse_version_labels(specs: list[str]) -> dict[str, dict[str, int]]:
    """`MODEL:LABEL=VERSION` flags → {model: {label: version}}."""
    labels: dict[str, dict[str, int]] = {}
    for spec in specs:
        model, sep, rest = spec.partition(":")
        label, eq, version = rest.partition("=")
        if not (sep and eq and model and label and version.isdigit()):
            raise BundleError(
                f"--version-label {spec!r} is not MODEL:LABEL=VERSION (e.g. half_plus_two:stable=123)"
            )
        labels.setdefault(model, {})[label] = int(version)
    return labels


def check_labels(service: ModelService, labels: Mapping[str, Mapping[str, int]]) -> None:
    """Every labelled model must be served."""
    for model in labels:
        if model not in service.manager.model_names():
            raise BundleError(
                f"--version-label names model {model}, which is not in the bundle; "
                f"models: {', '.join(service.manager.model_names())}"
            )


def _read_or_empty(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""
