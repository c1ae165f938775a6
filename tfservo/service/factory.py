"""The one service factory: settings → bundles loaded, handlers ready, one Invoker.

`build_service` is the only place a running service is assembled. The HTTP and gRPC
servers, `tfservo invoke`, `inspect`, every transform engine and the pipeline adapters call
it with the same `tfservo.core.settings.Settings`, so every mode behaves the same.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from tfservo.core import tracing
from tfservo.core.errors import BundleError, ServingError
from tfservo.core.settings import Settings
from tfservo.handlers.bundle_code import (
    Handlers,
    install_requirements,
    load_handlers,
    reload_handlers,
    unload_handlers,
)
from tfservo.models.bundle import Bundle, ModelSource, keras_file, open_bundle, serves_tflite
from tfservo.models.config_reloader import ModelConfigReloader
from tfservo.models.hooks import ModelHooks
from tfservo.models.lifecycle import ModelLifecycle
from tfservo.models.model_config import VersionPolicy
from tfservo.models.servables import ModelManager
from tfservo.service.api import TFServingAPI
from tfservo.service.invocation import Invoker
from tfservo.service.warmup import replay_warmup

if TYPE_CHECKING:
    from tfservo.service.variants import EndpointHooks

if TYPE_CHECKING:
    from tfservo.models.batching import BatchingRunnerFactory
    from tfservo.models.savedmodel import LoadedModel
    from tfservo.models.signing import TrustedKeys

__all__ = ["ModelService", "build_service"]

log = logging.getLogger("tfservo.service")



class ModelService:
    """Models, handlers, the TF Serving API and the invocation path of one or more bundles.

    Built by `build_service`; constructing one directly gives an empty service (tests and
    tools add bundles to it themselves).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        hooks: ModelHooks | None = None,
    ) -> None:
        self.settings = settings or Settings()
        # models that arrived from elsewhere (s3://, the management API, a Target-Model header):
        # their root dir → how, for the scan policy (tfservo.models.scan.policy_for)
        self._arrived: dict[str, str] = {}
        self._keys: TrustedKeys | None = None
        if self.settings.require_signature:
            from tfservo.models.signing import TrustedKeys

            self._keys = TrustedKeys(self.settings.require_signature)
        loader = self._load_version
        hooks = hooks or ModelHooks()
        self.runners = _runner_factory(self.settings, hooks)  # the batchers' maker; None: no batching
        self.manager = ModelManager(
            loader,
            runner_factory=self.runners,
            on_event=hooks.on_event,
            on_run=hooks.on_run,
            on_hold=hooks.on_hold,
            warmup=(lambda sv: replay_warmup(self.api, sv)) if self.settings.warmup else None,
        )
        self.api = TFServingAPI(self.manager, check_method_name=self.settings.signature_method_name_check)
        self.lifecycle = ModelLifecycle(self.manager)
        self.model_config = ModelConfigReloader(self)
        self.bundles: list[Bundle] = []
        self._archives: dict[str, str] = {}  # extracted root → the user's archive it came from
        self.configured_models: list[str] = []
        self._reloads = 0
        self.rest_base: str | None = None
        self.grpc_port: int | None = None
        self.grpc_socket: str | None = None  # a locked loopback server's gRPC, for handlers only
        # this service's own bundles' invocation path; `invoker` is what the doors call: the same, or a
        # pipeline's or an endpoint of variants' (service.pipeline, service.variants) over `members`
        self.bundle_invoker = Invoker(
            self.api,
            default_model=self.default_model,
            rest_base=lambda: self.rest_base or "http://127.0.0.1:8080",
            grpc_port=lambda: self.grpc_port,
            grpc_socket=lambda: self.grpc_socket,
        )
        self.invoker: Invoker = self.bundle_invoker
        self.members: list[ModelService] = []  # the other services `invoker` composes; closed with this one

    @property
    def batches(self) -> bool:
        """Whether model calls go through batchers (and so may wait for their batch)."""
        return self.settings.batching is not None

    # -- building ----------------------------------------------------------------------------

    def add_bundle(self, path_or_url: str) -> Bundle:
        """Open a bundle, prepare its code and load every model in it. The bundle's root code/
        applies to its own models without a code/ of their own (not to other bundles' models)."""
        bundle = open_bundle(path_or_url, limits=self.settings.archive_limits, code_only=self.settings.code_only_bundles)
        if not os.path.exists(path_or_url) and "://" in path_or_url and not path_or_url.startswith("file://"):
            self.mark_arrived(bundle.root, path_or_url.split("://", 1)[0] + "://")
        if os.path.isfile(bundle.source):  # an archive, extracted under bundle.root: errors name the archive
            self._archives[bundle.root] = bundle.source
        shared = None
        if bundle.code_dir:
            label = "bundle_" + hashlib.sha256(bundle.code_dir.encode()).hexdigest()[:10]
            shared = self._prepare_code(bundle.code_dir, label)
        for source in bundle.models.values():
            self.add_model(source, handlers=shared)
        if not bundle.models and shared is not None:  # code alone: its handlers answer every invocation
            self.bundle_invoker.universal_handlers = shared
        self.bundles.append(bundle)
        return bundle

    def add_model(
        self,
        source: ModelSource,
        policy: VersionPolicy | None = None,
        labels: Mapping[str, int] | None = None,
        *,
        handlers: Handlers | None = None,
    ) -> None:
        """Load one model's versions (all of them unless `policy` says otherwise) and its own
        code/ (else `handlers`, its bundle's root code/)."""
        if source.name in self.manager.model_names():
            raise BundleError(
                f"Model name {source.name} appears twice (again in {source.base_path}); "
                "rename one of the model dirs"
            )
        if source.code_dir:
            handlers = self._prepare_code(source.code_dir, source.name) or handlers
        if handlers is not None:
            self.bundle_invoker.handlers[source.name] = handlers
        if labels is None:
            labels = self.settings.version_labels.get(source.name)
        try:
            self.lifecycle.watch(
                source.name, source.base_path, policy or VersionPolicy.all(), labels, source.versions
            )
        except Exception:
            self._drop_handlers(source.name)
            raise
        self.configured_models.append(source.name)

    def mark_arrived(self, root: str, how: str) -> None:
        """Models under `root` arrived through `how` (s3://, the management API, …): the scan
        policy's auto refuses what they can do beyond computing."""
        self._arrived[os.path.realpath(root)] = how

    def _arrival(self, path: str) -> str | None:
        real = os.path.realpath(path)
        for root, how in self._arrived.items():
            if real == root or real.startswith(root + os.sep):
                return how
        return None

    def _load_version(self, path: str) -> LoadedModel:
        """Every version load: its signature checked (--require-signature), its scan's findings
        decided by the scan policy, then the model loaded (a SavedModel, TFLite or .keras file)."""
        from tfservo.models.scan import check_version

        version = os.path.basename(path)
        label = (f"model {os.path.basename(os.path.dirname(os.path.abspath(path)))} "
                 f"version {int(version) if version.isdigit() else version}")
        if self._keys is not None:
            from tfservo.models.signing import verify_dir

            verify_dir(path, self._keys, label)
        check_version(path, label, self.settings.scan_policy, self._arrival(path))
        return _load_model(self.settings, path)

    def _verify_code(self, code_dir: str) -> None:
        if self._keys is not None:
            from tfservo.models.signing import verify_dir

            verify_dir(code_dir, self._keys, "code")

    def set_universal_code(self, code_dir: str) -> None:
        """Use `code_dir`/inference.py for every model without its own code/."""
        self.bundle_invoker.universal_handlers = self._prepare_code(code_dir, "universal")

    def remove_model(self, name: str) -> None:
        self.lifecycle.unwatch(name)
        self._drop_handlers(name)
        if name in self.configured_models:
            self.configured_models.remove(name)

    def update_model(self, name: str, policy: VersionPolicy, labels: Mapping[str, int]) -> None:
        """Apply a new version policy and labels to a served model (a model config reload)."""
        self.lifecycle.update(name, policy, labels)

    def code_dirs(self) -> list[str]:
        """The code dirs whose inference.py this service runs."""
        return sorted({os.path.dirname(h.path) for h in self._all_handlers()})

    def reload_code(self, changed: Iterable[str] | None = None) -> list[str]:
        """Import again the inference.py (and lib/, helper modules) of the code dirs under the
        `changed` paths (all when None), without touching the loaded models. A handler that
        fails to import is logged with its file and line and the previous one keeps answering.
        Returns the code dirs reloaded."""
        paths = None if changed is None else [os.path.abspath(p) for p in changed]
        reloaded = []
        for old in self._all_handlers():
            code_dir = os.path.dirname(old.path)
            if paths is not None and not any(p == code_dir or p.startswith(code_dir + os.sep) for p in paths):
                continue
            self._reloads += 1
            try:
                self._verify_code(code_dir)
                new = reload_handlers(old, f"{old.module.__name__.split('__r')[0]}__r{self._reloads}")
            except ServingError as exc:
                log.error("code in %s not reloaded, the previous handler keeps answering: %s", code_dir, exc.message)
                continue
            for name, handlers in list(self.bundle_invoker.handlers.items()):
                if handlers is old:
                    self.bundle_invoker.handlers[name] = new
            if self.bundle_invoker.universal_handlers is old:
                self.bundle_invoker.universal_handlers = new
            reloaded.append(code_dir)
            log.info("reloaded %s (models unchanged)", old.path)
        return reloaded

    def _all_handlers(self) -> list[Handlers]:
        found: dict[int, Handlers] = {id(h): h for h in self.bundle_invoker.handlers.values()}
        if self.bundle_invoker.universal_handlers is not None:
            found[id(self.bundle_invoker.universal_handlers)] = self.bundle_invoker.universal_handlers
        return list(found.values())

    def _drop_handlers(self, name: str) -> None:
        handlers = self.bundle_invoker.handlers.pop(name, None)
        if handlers is not None and not any(h is handlers for h in self.bundle_invoker.handlers.values()):
            unload_handlers(handlers)  # no other model of its bundle uses it

    def _prepare_code(self, code_dir: str, label: str) -> Handlers | None:
        self._verify_code(code_dir)
        target = os.path.join(
            self.settings.requirements_dir or os.path.join(tempfile.gettempdir(), "tfservo-requirements"),
            # keyed by what is installed, so a re-extracted archive reuses its earlier install
            hashlib.sha256(label.encode() + _read_or_empty(os.path.join(code_dir, "requirements.txt"))).hexdigest()[:16],
        )
        # TensorFlow (and the Keras and Pillow it imports) first, in every mode: what the bundle's
        # requirements cannot replace is then the same whether serve, invoke or a transform loads it
        import tfservo.models.savedmodel  # noqa: F401

        install_requirements(code_dir, target)
        module = f"tfservo_user_inference_{label.replace('.', '_').replace('-', '_')}"
        return load_handlers(code_dir, module_name=module, shown_as=self._shown(code_dir))

    def _shown(self, code_dir: str) -> str | None:
        """How the user knows `code_dir`/inference.py: ARCHIVE:code/inference.py when it came out
        of their archive (None: its own path is theirs)."""
        script = os.path.join(os.path.abspath(code_dir), "inference.py")
        for root, archive in self._archives.items():
            if script.startswith(os.path.abspath(root) + os.sep):
                return f"{archive}:{os.path.relpath(script, root)}"
        return None

    # -- queries -----------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        return self.manager.model_names()

    def default_model(self) -> str | None:
        """SAGEMAKER_TFS_DEFAULT_MODEL_NAME (or --default-model), else the first model by name."""
        if self.settings.default_model_name:
            return self.settings.default_model_name
        if self.settings.multi_model:
            return None  # a multi-model endpoint has no default: requests must name the model
        names = self.manager.model_names()
        return names[0] if names else None

    def is_healthy(self) -> bool:
        """Every configured model has at least one AVAILABLE version (multi-model mode: always),
        a pipeline's every container's and an endpoint's every variant's too."""
        return not self.unavailable_models()

    def unavailable_models(self) -> list[str]:
        """Configured models without an AVAILABLE version (none in multi-model mode)."""
        if self.settings.multi_model:
            return []
        served = {m.name: m for m in self.manager.models()}
        missing = [name for name in self.configured_models if name not in served or not served[name].available()]
        return missing + [name for member in self.members for name in member.unavailable_models()]

    def load_errors(self) -> list[str]:
        """'model M version V: error' for every version that failed to load."""
        return [
            f"model {m.name} version {v.version}: {v.error}"
            for m in self.manager.models()
            for v in m.versions.values()
            if v.error
        ]

    def close(self) -> None:
        closing = getattr(self.invoker, "close", None)
        if self.invoker is not self.bundle_invoker and closing is not None:
            closing()  # a shadow's threads, the weights table
        for member in self.members:
            member.close()
        self.members = []
        tracing.flush()
        self.lifecycle.stop()
        self.manager.close()
        for name in list(self.bundle_invoker.handlers):
            self._drop_handlers(name)
        if self.bundle_invoker.universal_handlers is not None:
            unload_handlers(self.bundle_invoker.universal_handlers)
            self.bundle_invoker.universal_handlers = None


def build_service(
    settings: Settings,
    *,
    hooks: ModelHooks | None = None,
    endpoint_hooks: EndpointHooks | None = None,
    shared_dir: str | None = None,
) -> ModelService:
    """The running service for `settings`: every bundle in settings.paths and the model
    config file loaded, labels and the default model checked, file-system polling started.
    With --variants, one service per variant behind a VariantInvoker; with --pipeline, one per
    container behind a PipelineInvoker (`shared_dir`: the server's folder of shared tables)."""
    tracing.configure()  # every process that runs a model: serve's workers, transforms, pipelines
    if settings.variants_file:
        from tfservo.service.endpoint_build import build_variants

        return build_variants(settings, _build_one, hooks, endpoint_hooks, shared_dir)
    if settings.pipeline and len(settings.paths) > 1:
        from tfservo.service.endpoint_build import build_pipeline

        return build_pipeline(settings, _build_one, hooks, endpoint_hooks)
    return _build_one(settings, hooks)


def _build_one(settings: Settings, hooks: ModelHooks | None) -> ModelService:
    """The service of the bundles in settings.paths, side by side."""
    service = ModelService(settings, hooks=hooks)
    try:
        for path in settings.paths:
            service.add_bundle(path)
        if settings.model_config_file:
            service.model_config.load_file(settings.model_config_file)
        if settings.model_base_path:
            service.model_config.load_base_path(settings.model_name, settings.model_base_path)
        _check_selection(service, settings)
        service.lifecycle.start_polling(settings.file_system_poll_wait_seconds)
    except BaseException:
        service.close()
        raise
    return service


def _check_selection(service: ModelService, settings: Settings) -> None:
    """Every labelled model and the default model must be served."""
    names = service.manager.model_names()
    where = ", ".join(settings.paths) or settings.model_config_file or settings.model_base_path or "the served models"
    for model in settings.version_labels:
        if model not in names:
            raise BundleError(
                f"--version-label names model {model}, which is not in the bundle; models: {', '.join(names)}"
            )
    wanted = settings.default_model_name
    if wanted and not settings.multi_model and wanted not in names:
        raise BundleError(
            f"SAGEMAKER_TFS_DEFAULT_MODEL_NAME={wanted!r} names no model in {where}; "
            f"the models are: {', '.join(names) or '(none)'}. Set it to one of them or unset it."
        )


def _runner_factory(settings: Settings, hooks: ModelHooks) -> BatchingRunnerFactory | None:
    if settings.batching is None:
        return None
    from tfservo.models.batching import make_runner_factory

    return make_runner_factory(settings.batching, on_batch=hooks.on_batch, on_queue=hooks.on_queue)


def _load_model(settings: Settings, path: str) -> LoadedModel:
    """A version dir's model: its SavedModel, or its model.tflite where there is no SavedModel
    or --prefer-tflite-model says so (as TF Serving chooses), or its Keras 3 .keras file."""
    if serves_tflite(path, settings.prefer_tflite_model):
        from tfservo.models.tflite import load_tflite_model

        return load_tflite_model(path, interpreters=settings.tflite_interpreters, threads=settings.intra_op_threads)
    keras = keras_file(path)
    if keras is not None:
        from tfservo.models.keras_model import load_keras_model

        return load_keras_model(path, keras, trust_code=settings.trust_model_code,
                                intra_op_threads=settings.intra_op_threads, inter_op_threads=settings.inter_op_threads)
    from tfservo.models.savedmodel import load_saved_model

    return load_saved_model(path, intra_op_threads=settings.intra_op_threads, inter_op_threads=settings.inter_op_threads)


def _read_or_empty(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""
