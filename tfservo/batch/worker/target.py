"""What a Beam handler runs: one model version's signature and method, or the /invocations path.

Model, version, signature and method are chosen the way `tfservo serve` chooses them: the
handler's arguments first, then the tfs-* custom attributes, then the default model (highest
version, `serving_default`); a signature's own method_name decides between predict, classify
and regress when nobody names a method (as tfx-bsl does).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from tfservo.codecs.results import check_classify_signature, check_regress_signature
from tfservo.core.errors import InvalidArgument, ServingError
from tfservo.models.calls import METHODS
from tfservo.models.signatures import CLASSIFY_METHOD, REGRESS_METHOD, SignatureDef
from tfservo.service.custom_attributes import CustomAttributes

__all__ = [
    "INVOKE",
    "OUTPUTS",
    "check_method",
    "check_options",
    "choose_method",
    "LoadedTarget",
    "merged_attributes",
    "Target",
]

INVOKE = "invoke"  # raw request bytes through the bundle's content conversion / inference.py
OUTPUTS = ("prediction_result", "prediction_log")


@dataclass(frozen=True)
class Target:
    """The resolved model version and signature (or, for method "invoke", the /invocations path)."""

    source: str  # bundle path/URL or endpoint URL, for messages
    method: str  # predict | classify | regress | invoke
    model_name: str | None = None
    version: int | None = None
    signature: SignatureDef | None = None
    feature_types: dict[str, str] = field(default_factory=dict)  # for JSON-dict examples

    @property
    def model_id(self) -> str:
        """`name/version` (what PredictionResult.model_id carries)."""
        name = self.model_name or "default model"
        return f"{name}/{self.version}" if self.version is not None else name

    def describe(self) -> str:
        """A phrase naming model, version, signature and method, for error messages."""
        if self.method == INVOKE:
            return f"invocations of {self.model_name or 'the default model'} in {self.source}"
        assert self.signature is not None
        return (
            f"model {self.model_name} version {self.version} signature {self.signature.name} "
            f"({self.method}) in {self.source}"
        )


def choose_method(method: str | None, attrs: CustomAttributes, signature: SignatureDef) -> str:
    """The handler's method, else tfs-method, else the signature's kind (classify/regress), else predict."""
    chosen = method or attrs.method
    if chosen:
        return chosen
    if signature.method_name == CLASSIFY_METHOD:
        return "classify"
    if signature.method_name == REGRESS_METHOD:
        return "regress"
    return "predict"


def check_method(method: str, signature: SignatureDef, where: str, *, check_method_name: bool = False) -> None:
    """Refuse, before any data flows, a signature the method cannot run (its method_name only
    with the signature method name check on, as the server checks)."""
    try:
        if method == "classify":
            check_classify_signature(signature, check_method_name=check_method_name)
        elif method == "regress":
            check_regress_signature(signature, check_method_name=check_method_name)
    except ServingError as exc:
        raise InvalidArgument(f"{method} cannot run on {where}: {exc.message}; pass signature_name= or method=") from None


def check_options(method: str | None, output: str, content_type: str | None, accept: str | None) -> None:
    """Validate handler arguments when the handler is built, so a pipeline fails at construction."""
    if method is not None and method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {', '.join(METHODS)} (or None to pick it)")
    if output not in OUTPUTS:
        raise ValueError(f"output={output!r} is not one of {', '.join(OUTPUTS)}")
    if content_type is None and accept is not None:
        raise ValueError(
            "accept= only applies to raw request bytes; pass content_type= too (e.g. 'text/csv')"
        )
    if content_type is not None and output == "prediction_log":
        raise ValueError(
            "output='prediction_log' needs arrays or tf.train.Examples, not raw request bytes; "
            "drop content_type= or use output='prediction_result'"
        )


def merged_attributes(custom_attributes: str | None, version: int | None, method: str | None) -> str | None:
    """The custom attributes with the handler's version and method appended (the last key wins)."""
    items = [custom_attributes] if custom_attributes else []
    if version is not None:
        items.append(f"tfs-model-version={version}")
    if method is not None:
        items.append(f"tfs-method={method}")
    return ",".join(items) or None


class LoadedTarget:
    """A loaded model (in-process bundle or remote endpoint): its resolved target, and its load
    time reported once to Beam's metrics. Methods only: multi-process proxies forward calls."""

    def _loaded(self, target: Target, started: float) -> None:
        """Record the resolved target; `started` is the perf_counter() time loading began."""
        self._target = target
        self._load_millis: int | None = int((time.perf_counter() - started) * 1000)
        self._load_lock = threading.Lock()

    def target(self) -> Target:
        """The resolved model version, signature and method."""
        return self._target

    def take_load_millis(self) -> int | None:
        """The load time in ms the first time it is asked for, then None (reported once)."""
        with self._load_lock:
            millis, self._load_millis = self._load_millis, None
        return millis
