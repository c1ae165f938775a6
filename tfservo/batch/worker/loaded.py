"""A bundle loaded inside a pipeline worker (Beam, Ray Data, Spark): the same ModelService
`tfservo serve` builds.

`LoadedBundle` is what BundleModelHandler.load_model returns and Beam shares per worker
process (or, with share_model_across_processes, per machine through a proxy: so it is used
only through methods taking and returning picklable values). Arrays go through TFServingAPI's
array-level predict/classify/regress; raw request bytes through `service.invoker.invoke`,
exactly the /invocations path, with a loopback REST and gRPC server so inference.py's
context.rest_uri and context.channel answer.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tfservo.batch.worker.target import (
    INVOKE,
    LoadedTarget,
    Target,
    check_method,
    choose_method,
    merged_attributes,
)
from tfservo.core.errors import BundleError, NotFound, ServingError
from tfservo.core.logs import quiet_libraries
from tfservo.core.settings import resolve_settings
from tfservo.models.signatures import DEFAULT_SIGNATURE
from tfservo.server.loopback import HandlerEndpoints, start_handler_endpoints
from tfservo.service.custom_attributes import parse_custom_attributes, requested_model
from tfservo.service.factory import ModelService, build_service
from tfservo.service.invocation import result_error

__all__ = ["LoadedBundle", "Selection"]

log = logging.getLogger("tfservo.batch.worker")


@dataclass(frozen=True)
class Selection:
    """What the handler asked for; None means "as the server would choose"."""

    model_name: str | None = None
    version: int | None = None
    signature_name: str | None = None
    method: str | None = None
    content_type: str | None = None
    accept: str | None = None
    custom_attributes: str | None = None


class LoadedBundle(LoadedTarget):
    """One loaded bundle and the model version, signature and method a handler runs."""

    def __init__(
        self, bundle: str, selection: Selection, *, intra_op_threads: int = 0, inter_op_threads: int = 0,
        poll_seconds: float = 0,
    ) -> None:
        t0 = time.perf_counter()
        quiet_libraries()  # TensorFlow's load notices and C++ lines off (TFSERVO_TF_LOGS=1 keeps them)
        settings = resolve_settings(
            paths=[bundle],
            multi_model=False,
            serving=False,
            intra_op_threads=intra_op_threads or None,
            inter_op_threads=inter_op_threads or None,
            file_system_poll_wait_seconds=poll_seconds or None,
        )
        self._bundle = bundle
        # following new version dirs: the latest version is looked up again for each batch
        self._follow = poll_seconds > 0 and selection.version is None
        self.service = build_service(settings)
        self._loopback: HandlerEndpoints | None = None
        try:
            target = _select(self.service, bundle, selection)
            if selection.content_type is not None:  # raw bodies: the invocation path, handlers and all
                self._loopback = start_handler_endpoints(self.service)
        except BaseException:
            self.service.close()
            raise
        self._selection = selection
        self._attributes = merged_attributes(selection.custom_attributes, selection.version, selection.method)
        self._loaded(target, t0)
        # Beam drops a shared model by dropping its last reference: stop the server then.
        weakref.finalize(self, _shutdown, self.service, self._loopback).atexit = False
        log.info("loaded %s in %d ms", self._target.describe(), self._load_millis)

    # Only methods below: a multi-process proxy forwards method calls, not attributes.

    def target(self) -> Target:
        """The resolved target; when following version dirs, the latest version available now."""
        if self._follow:
            t = self._target
            assert t.model_name is not None
            latest = self.service.manager.resolve(t.model_name, None).version
            if latest != t.version:
                self._target = _select(self.service, self._bundle, self._selection)
                log.info("now running %s", self._target.describe())
        return self._target

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the signature on a batch of inputs."""
        t = self._target
        assert t.signature is not None and t.model_name is not None
        return self.service.api.predict(t.model_name, t.version, None, t.signature.name, inputs).outputs

    def classify(self, examples: Sequence[bytes]) -> list[list[tuple[str, float]]]:
        """Classify serialized tf.train.Examples: per example its (label, score) pairs."""
        t = self._target
        assert t.signature is not None and t.model_name is not None
        return self.service.api.classify(t.model_name, t.version, None, t.signature.name, examples).results

    def regress(self, examples: Sequence[bytes]) -> list[float]:
        """Regress serialized tf.train.Examples: one value per example."""
        t = self._target
        assert t.signature is not None and t.model_name is not None
        return self.service.api.regress(t.model_name, t.version, None, t.signature.name, examples).results

    def invoke(self, body: bytes) -> bytes:
        """One /invocations request; a non-2xx answer raises the ServingError of its kind."""
        s = self._selection
        result = self.service.invoker.invoke(body, s.content_type, s.accept, self._attributes, s.model_name)
        if not result.ok:
            raise result_error(result, f"/invocations of {self._target.model_id}")
        return result.body

    def invoke_many(self, bodies: Sequence[bytes]) -> list[bytes | ServingError]:
        """Several /invocations requests, answered as if each came alone, in as few model calls as
        their content type allows (Invoker.call_many); a failed one is its ServingError."""
        s = self._selection
        results = self.service.invoker.call_many(bodies, s.content_type, s.accept, self._attributes, s.model_name)
        out: list[bytes | ServingError] = []
        for result in results:
            result = result.encoded()
            if result.ok:
                out.append(result.body)
            else:
                out.append(result_error(result, f"/invocations of {self._target.model_id}"))
        return out

    def close(self) -> None:
        """Stop the loopback server and unload the models."""
        _shutdown(self.service, self._loopback)


def _shutdown(service: ModelService, loopback: HandlerEndpoints | None) -> None:
    if loopback is not None:
        loopback.stop()
    service.close()


def _select(service: ModelService, bundle: str, selection: Selection) -> Target:
    """Resolve model, version, signature and method as the server would, or fail saying why."""
    attrs = parse_custom_attributes(selection.custom_attributes)
    name = requested_model(selection.model_name, attrs, service.default_model)
    models = service.manager.model_names()
    if not name:
        raise BundleError(f"No models in {bundle}; nothing to run inference with")
    if name not in models:
        raise BundleError(
            f"Model {name} is not in {bundle}; its models are: {', '.join(models)}. "
            "Pass model_name= one of them (or fix tfs-model-name / $SAGEMAKER_TFS_DEFAULT_MODEL_NAME)"
        )
    version = selection.version if selection.version is not None else attrs.version_number
    try:
        sv = service.manager.resolve(name, version)
    except NotFound as exc:
        served = [v.version for v in service.manager.model(name).available()]
        what = f"Model {name} has no loaded version {version}" if version is not None else exc.message
        raise BundleError(
            f"{what} in {bundle} (loaded versions: {', '.join(map(str, served)) or 'none'}); "
            "pass version= one of them"
        ) from None
    if selection.content_type is not None:
        return Target(bundle, INVOKE, name, sv.version)
    try:
        signature = sv.signature(selection.signature_name or DEFAULT_SIGNATURE)
    except ServingError as exc:
        raise BundleError(f"{exc.message} (in {bundle}); pass signature_name= one of them") from None
    method = choose_method(selection.method, attrs, signature)
    target = Target(bundle, method, name, sv.version, signature, sv.loaded.example_feature_types())
    check_method(method, signature, target.describe(), check_method_name=service.api.check_method_name)
    return target
