"""TF Serving's API on top of the model manager: predict, classify, regress, metadata, status.

One implementation behind every surface: a request is decoded once into a Call
(tfserving.dataplane), run on the version a ServableHandle holds for the whole call, and
answered as arrays; `rest` writes TF Serving's JSON at the edge. gRPC, pipelines and the
batcher's callers use the array-level methods.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from google.protobuf import json_format

from tfservo.codecs import tfs_json as json_codec
from tfservo.codecs.examples import build_examples
from tfservo.codecs.results import (
    check_classify_signature,
    check_regress_signature,
    classification_results,
    regression_results,
)
from tfservo.core import tracing
from tfservo.core.errors import InvalidArgument
from tfservo.models.calls import (
    METHODS,
    Answer,
    Call,
    Classification,
    ExamplesCall,
    PredictCall,
    Prediction,
    Regression,
)
from tfservo.models.model_status import model_status
from tfservo.models.servables import ModelManager, ServableHandle, ServableVersion
from tfservo.models.signatures import (
    DEFAULT_SIGNATURE,
    SignatureDef,
)

if TYPE_CHECKING:
    from tfservo.models.batching.batcher import LoopBatches

__all__ = ["METHODS", "TFServingAPI", "signature_def_map", "signature_def_map_proto"]


class TFServingAPI:
    """The TF Serving API over a ModelManager."""

    def __init__(self, manager: ModelManager, *, check_method_name: bool = False) -> None:
        self.manager = manager
        # TF Serving's --enable_signature_method_name_check: off, classify/regress run on any
        # signature of the right shape (TF2 exports mark every signature predict)
        self.check_method_name = check_method_name

    # -- one call on one version -----------------------------------------------------------------

    def run(self, sv: ServableVersion, call: Call) -> Answer:
        """Run a decoded call on `sv` (held by the caller's handle, or loading: warmup)."""
        if isinstance(call, PredictCall):
            name = call.signature_name or DEFAULT_SIGNATURE
            if call.signature is None:
                sv.signature(name)  # a clear error naming the model before running anything
            outputs = sv.run(name, call.inputs, call.output_keys)
            return Prediction(sv.model_name, sv.version, name, outputs, call.row_format)
        sig, outputs = self._run_examples(sv, call)
        if call.method == "classify":
            results = classification_results(outputs, sig, len(call.examples))
            return Classification(sv.model_name, sv.version, sig.name, results)
        return Regression(sv.model_name, sv.version, sig.name, regression_results(outputs, sig, len(call.examples)))

    def run_held(self, handle: ServableHandle, call: Call) -> Answer:
        """Run a prepared call on the version `handle` holds (`prepare`, `decode`,
        `prepare_predict`), and release that version after."""
        with handle as sv:
            return self.run(sv, call)

    def _run_examples(self, sv: ServableVersion, call: ExamplesCall) -> tuple[SignatureDef, dict[str, np.ndarray]]:
        sig = sv.signature(call.signature_name or DEFAULT_SIGNATURE)
        check = check_classify_signature if call.method == "classify" else check_regress_signature
        try:  # TF Serving's PreProcessClassification / PreProcessRegression
            check(sig, check_method_name=self.check_method_name)
        except InvalidArgument as exc:
            keras = sv.model.keras_file if sv.model is not None else None
            if keras is not None:
                raise InvalidArgument(
                    f"{call.method} of model {sv.model_name} version {sv.version}: it is served from the Keras "
                    f"file {os.path.basename(keras)}, whose one signature ({sig.name}) predicts; {call.method} needs a "
                    "signature that takes serialized tf.Examples. Send its inputs to :predict (or /invocations) instead"
                ) from None
            raise InvalidArgument(
                f"{call.method} with signature {sig.name} of model {sv.model_name} version {sv.version}: "
                f"{exc.message}; pick a {call.method} signature with signature_name"
            ) from None
        if not call.examples:
            raise InvalidArgument("Input is empty: send at least one example")
        (key,) = sig.inputs
        batch = np.empty(len(call.examples), dtype=object)
        batch[:] = list(call.examples)
        return sig, sv.run(sig.name, {key: batch})

    # -- array level -------------------------------------------------------------------------

    def call(self, name: str, version: int | None, label: str | None, call: Call) -> Answer:
        """Run `call` on the version the request names, holding it for the call."""
        return self.run_held(self.manager.acquire(name, version, label), call)

    def predict(
        self,
        name: str,
        version: int | None,
        label: str | None,
        signature_name: str,
        inputs: dict[str, np.ndarray],
        output_keys: Sequence[str] | None = None,
    ) -> Prediction:
        """Run decoded tensors as a predict on the version the request names (`prepare_predict`)."""
        answer = self.run_held(*self.prepare_predict(name, version, label, signature_name, inputs, output_keys))
        assert isinstance(answer, Prediction)
        return answer

    def prepare_predict(
        self,
        name: str,
        version: int | None,
        label: str | None,
        signature_name: str,
        inputs: dict[str, np.ndarray],
        output_keys: Sequence[str] | None = None,
    ) -> tuple[ServableHandle, PredictCall]:
        """Decoded tensors as a predict on the version the request names, held for it (the
        caller runs the call, e.g. queued by `submit`, and releases the handle)."""
        keys = tuple(output_keys) if output_keys is not None else None
        return self.manager.acquire(name, version, label), PredictCall(signature_name, inputs, True, keys)

    def classify(
        self, name: str, version: int | None, label: str | None, signature_name: str, examples: Sequence[bytes]
    ) -> Classification:
        answer = self.call(name, version, label, ExamplesCall("classify", signature_name, examples))
        assert isinstance(answer, Classification)
        return answer

    def regress(
        self, name: str, version: int | None, label: str | None, signature_name: str, examples: Sequence[bytes]
    ) -> Regression:
        answer = self.call(name, version, label, ExamplesCall("regress", signature_name, examples))
        assert isinstance(answer, Regression)
        return answer

    # -- REST level --------------------------------------------------------------------------

    def decode_rest(self, method: str, body: bytes | dict[str, object], sv: ServableVersion) -> Call:
        """A TF Serving REST body (bytes, or a parsed request dict from a handler or a content
        conversion) as the call it asks `sv` for."""
        if method not in METHODS:
            raise InvalidArgument(f"Unknown method {method!r}; use one of {', '.join(METHODS)}")
        doc = _request_doc(body)
        if method == "predict":
            return json_codec.decode_predict_request(doc, sv.signature)
        ex = json_codec.decode_classify_regress_request(doc, method)
        examples = build_examples(ex.examples, ex.context, sv.loaded.example_feature_types())
        return ExamplesCall(method, ex.signature_name, examples)

    def infer(
        self, method: str, name: str, version: int | None, label: str | None, body: bytes | dict[str, object]
    ) -> Answer:
        """Decode a TF Serving REST body and run it: one version lookup, held for the call."""
        return self.run_held(*self.decode(method, name, version, label, body))

    def decode(
        self, method: str, name: str, version: int | None, label: str | None, body: bytes | dict[str, object]
    ) -> tuple[ServableHandle, Call]:
        """`prepare`, as the request's "decode" span."""
        with tracing.span("decode", {"tfservo.method": method}, leaf=True):
            return self.prepare(method, name, version, label, body)

    def prepare(
        self, method: str, name: str, version: int | None, label: str | None, body: bytes | dict[str, object]
    ) -> tuple[ServableHandle, Call]:
        """A REST body decoded for the version it resolves to, and that version held (the
        caller runs the call and releases the handle)."""
        if method not in METHODS:
            raise InvalidArgument(f"Unknown method {method!r}; use one of {', '.join(METHODS)}")
        doc = _request_doc(body)  # first: a malformed body never resolves a version
        handle = self.manager.acquire(name, version, label)
        try:
            return handle, self.decode_rest(method, doc, handle.servable)
        except BaseException:
            handle.release()
            raise

    def rest(
        self, method: str, name: str, version: int | None, label: str | None, body: bytes | dict[str, object]
    ) -> bytes:
        """Run a TF Serving REST request (`:predict`, `:classify`, `:regress`) → its JSON answer."""
        return self.encode_rest(self.infer(method, name, version, label, body))

    @staticmethod
    def encode_rest(answer: Answer) -> bytes:
        """An answer as TF Serving's REST JSON, as the request's "encode" span."""
        with tracing.span("encode", {"tfservo.content_type": "application/json"}, leaf=True):
            return json_codec.encode_answer(answer)

    @staticmethod
    def write_rest(answer: Answer) -> bytes:
        """An answer as TF Serving's REST JSON (for a door whose queued call makes the span)."""
        return json_codec.encode_answer(answer)

    def submit(
        self,
        handle: ServableHandle,
        call: Call,
        done: Callable[[Answer | None, BaseException | None], None],
        *,
        here: LoopBatches | None = None,
    ) -> bool:
        """Queue a prepared predict on its version's batcher without waiting: `done` gets the
        answer (or the error) from a batch thread, inside the request's trace — or on the
        caller's event loop (`here`) when its model is quick (see Batcher.submit).

        Takes `handle` (released when the call ends) only when it returns True. False, with
        nothing queued, when the call must go through `run` instead: not a predict, no batcher,
        or more rows than one batch holds. Request errors raise here, as in `run`.
        """
        batched = _batched_predict(handle, call)
        if batched is None:
            return False
        sv, call, name = batched
        within = tracing.parent()  # the request's (None when tracing is off)

        def finish(outputs: dict[str, np.ndarray] | None, error: BaseException | None) -> None:
            handle.release()
            answer = None if outputs is None else Prediction(sv.model_name, sv.version, name, outputs, call.row_format)
            if within is None:
                done(answer, error)
                return
            with tracing.activate(within):  # on a batch thread: spans go under the request
                done(answer, error)

        return sv.submit(name, call.inputs, call.output_keys, finish, here=here)

    def run_lone(self, handle: ServableHandle, call: Call, here: LoopBatches) -> Answer | None:
        """A prepared predict that its door holds alone, answered at once in this thread when its
        version's batcher is idle and its model quick (Batcher.run_lone), and its version then
        released; None, with `handle` still held, when it must be `submit`ted instead. Request
        and model errors raise here."""
        batched = _batched_predict(handle, call)
        if batched is None:
            return None
        sv, call, name = batched
        outputs = sv.run_lone(name, call.inputs, call.output_keys, here)
        if outputs is None:
            return None
        handle.release()
        return Prediction(sv.model_name, sv.version, name, outputs, call.row_format)

    # -- metadata and status -------------------------------------------------------------------

    def metadata(self, name: str, version: int | None, label: str | None) -> dict[str, object]:
        """GET /v1/models/{m}/metadata: signature defs in TF Serving's JSON shape."""
        sv = self.manager.resolve(name, version, label)
        sig_map = signature_def_map(sv.loaded.meta_graph_def)
        return {
            "model_spec": {"name": name, "signature_name": "", "version": str(sv.version)},
            "metadata": {"signature_def": sig_map},
        }

    def signature_defs(self, name: str, version: int | None, label: str | None) -> tuple[ServableVersion, object]:
        """The resolved version and its SignatureDefMap proto (gRPC GetModelMetadata)."""
        sv = self.manager.resolve(name, version, label)
        return sv, signature_def_map_proto(sv.loaded.meta_graph_def)

    def status(self, name: str, version: int | None, label: str | None) -> dict[str, object]:
        """GET /v1/models/{m}: the state of every version, or of the one asked for (failed ones too)."""
        return model_status(self.manager, name, version, label)


def _batched_predict(handle: ServableHandle, call: Call) -> tuple[ServableVersion, PredictCall, str] | None:
    """(version, call, signature name) for a predict its version batches; None for any other
    call (`run` takes those). A signature the version lacks raises, naming the model."""
    sv = handle.servable
    if not isinstance(call, PredictCall) or sv.runner is None:
        return None
    name = call.signature_name or DEFAULT_SIGNATURE
    if call.signature is None:
        sv.signature(name)  # a clear error naming the model before anything is queued or run
    return sv, call, name


def _request_doc(body: bytes | bytearray | str | dict[str, object]) -> dict[str, object]:
    """A REST request body as its JSON object (a dict passes as it is: arrays from handlers)."""
    doc = json_codec.parse_request(body) if isinstance(body, (bytes, bytearray, str)) else body
    if not isinstance(doc, dict):
        raise InvalidArgument(
            "Request body must be a JSON object such as "
            '{"instances": [...]}, {"inputs": ...} or {"examples": [...]}'
        )
    return doc


def signature_def_map(meta_graph_def: object) -> dict[str, object]:
    """A MetaGraphDef's signatures as TF Serving prints a SignatureDefMap in JSON."""
    doc: dict[str, object] = json_format.MessageToDict(
        signature_def_map_proto(meta_graph_def),
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return doc


def signature_def_map_proto(meta_graph_def: Any) -> object:
    """A MetaGraphDef's signatures as TF Serving's SignatureDefMap proto."""
    from tensorflow_serving.apis import get_model_metadata_pb2

    sig_map = get_model_metadata_pb2.SignatureDefMap()
    for key, sig in meta_graph_def.signature_def.items():
        sig_map.signature_def[key].CopyFrom(sig)
    return sig_map
