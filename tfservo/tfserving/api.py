"""TF Serving's API on top of the model manager: predict, classify, regress, metadata, status.

Two surfaces share one implementation: array level (used by gRPC, Beam and the batcher's
callers) and REST level (JSON bytes in, JSON bytes out, used by HTTP and /invocations).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format

from tfservo.errors import InvalidArgument
from tfservo.runtime.signatures import (
    CLASSIFY_METHOD,
    DEFAULT_SIGNATURE,
    REGRESS_METHOD,
    SignatureDef,
)
from tfservo.tfserving import json_codec
from tfservo.tfserving.examples import build_examples
from tfservo.tfserving.model_status import model_status
from tfservo.tfserving.results import classification_results, regression_results
from tfservo.tfserving.servables import ModelManager, ServableVersion

METHODS = ("predict", "classify", "regress")


class TFServingAPI:
    """The TF Serving API over a ModelManager."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    # -- array level -------------------------------------------------------------------------

    def predict(
        self,
        name: str,
        version: int | None,
        label: str | None,
        signature_name: str,
        inputs: dict[str, np.ndarray],
        output_keys: Sequence[str] | None = None,
    ) -> tuple[ServableVersion, dict[str, np.ndarray]]:
        sv = self.manager.resolve(name, version, label)
        return sv, self.predict_on(sv, signature_name, inputs, output_keys)

    def predict_on(
        self,
        sv: ServableVersion,
        signature_name: str,
        inputs: dict[str, np.ndarray],
        output_keys: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Predict on one given version (also one still loading: warmup replays through this)."""
        sv.signature(signature_name or DEFAULT_SIGNATURE)
        return sv.run(signature_name or DEFAULT_SIGNATURE, inputs, output_keys)

    def classify(
        self,
        name: str,
        version: int | None,
        label: str | None,
        signature_name: str,
        examples: Sequence[bytes],
    ) -> tuple[ServableVersion, list[list[tuple[str, float]]]]:
        sv = self.manager.resolve(name, version, label)
        return sv, self.classify_on(sv, signature_name, examples)

    def classify_on(
        self, sv: ServableVersion, signature_name: str, examples: Sequence[bytes]
    ) -> list[list[tuple[str, float]]]:
        """Classify on one given version (also one still loading, for warmup)."""
        sig, outputs = self._run_examples(sv, signature_name, examples, CLASSIFY_METHOD)
        return classification_results(outputs, sig, len(examples))

    def regress(
        self,
        name: str,
        version: int | None,
        label: str | None,
        signature_name: str,
        examples: Sequence[bytes],
    ) -> tuple[ServableVersion, list[float]]:
        sv = self.manager.resolve(name, version, label)
        return sv, self.regress_on(sv, signature_name, examples)

    def regress_on(
        self, sv: ServableVersion, signature_name: str, examples: Sequence[bytes]
    ) -> list[float]:
        """Regress on one given version (also one still loading, for warmup)."""
        sig, outputs = self._run_examples(sv, signature_name, examples, REGRESS_METHOD)
        return regression_results(outputs, sig, len(examples))

    def _run_examples(
        self, sv: ServableVersion, signature_name: str, examples: Sequence[bytes], method: str
    ) -> tuple[SignatureDef, dict[str, np.ndarray]]:
        sig = sv.signature(signature_name or DEFAULT_SIGNATURE)
        if sig.method_name != method:
            raise InvalidArgument(
                f"Expected {method.rsplit('/', 1)[-1]} signature method_name to be {method}. "
                f"Was: {sig.method_name} (model {sv.model_name} version {sv.version}, "
                f"signature {sig.name}); pick a signature with signature_name"
            )
        if len(sig.inputs) != 1:
            raise InvalidArgument(
                f"Expected one input Tensor in signature {sig.name} of model {sv.model_name}, "
                f"found {len(sig.inputs)}"
            )
        if not examples:
            raise InvalidArgument("Input is empty: send at least one example")
        (key,) = sig.inputs
        batch = np.empty(len(examples), dtype=object)
        batch[:] = list(examples)
        return sig, sv.run(sig.name, {key: batch})

    # -- REST level --------------------------------------------------------------------------

    def rest(
        self, method: str, name: str, version: int | None, label: str | None, body: bytes | dict
    ) -> bytes:
        """Run a TF Serving REST request (`:predict`, `:classify`, `:regress`) and encode the answer."""
        doc = _request_doc(body)
        if method == "predict":
            sv = self.manager.resolve(name, version, label)
            req = json_codec.decode_predict_request(doc, sv.signature)
            outputs = sv.run(req.signature_name, req.inputs)
            return json_codec.encode_predict_response(outputs, req.row_format)
        if method in ("classify", "regress"):
            sv = self.manager.resolve(name, version, label)
            req = json_codec.decode_classify_regress_request(doc)
            examples = build_examples(req.examples, req.context, sv.model.example_feature_types())
            if method == "classify":
                _, results = self.classify(name, sv.version, None, req.signature_name, examples)
                return json_codec.encode_classify_response(results)
            _, results = self.regress(name, sv.version, None, req.signature_name, examples)
            return json_codec.encode_regress_response(results)
        raise InvalidArgument(f"Unknown method {method!r}; use one of {', '.join(METHODS)}")

    def submit_predict(
        self,
        name: str,
        version: int | None,
        label: str | None,
        body: bytes,
        done: Callable[[bytes | None, BaseException | None], None],
    ) -> bool:
        """A REST `:predict` that does not wait for its batch: decodes and queues it, and `done`
        gets the encoded answer (or the error) from a batch thread.

        False, with nothing queued, when the call must go through `rest` instead (no batching,
        or more rows than one batch holds). Request errors raise here, as in `rest`.
        """
        doc = _request_doc(body)  # first, as in `rest`: a malformed body never resolves a version
        sv = self.manager.resolve(name, version, label)
        if sv.runner is None:
            return False
        req = json_codec.decode_predict_request(doc, sv.signature)

        def encode(outputs: dict[str, np.ndarray] | None, error: BaseException | None) -> None:
            if error is not None:
                done(None, error)
                return
            try:
                answer = json_codec.encode_predict_response(outputs, req.row_format)
            except Exception as exc:  # noqa: BLE001 - handed to the caller like any other error
                done(None, exc)
                return
            done(answer, None)

        return sv.submit(req.signature_name, req.inputs, encode)

    def metadata(self, name: str, version: int | None, label: str | None) -> dict[str, Any]:
        """GET /v1/models/{m}/metadata: signature defs in TF Serving's JSON shape."""
        sv = self.manager.resolve(name, version, label)
        sig_map = signature_def_map(sv.model.meta_graph_def)
        return {
            "model_spec": {"name": name, "signature_name": "", "version": str(sv.version)},
            "metadata": {"signature_def": sig_map},
        }

    def signature_defs(self, name: str, version: int | None, label: str | None) -> tuple[ServableVersion, Any]:
        """The resolved version and its SignatureDefMap proto (gRPC GetModelMetadata)."""
        sv = self.manager.resolve(name, version, label)
        return sv, signature_def_map_proto(sv.model.meta_graph_def)

    def status(self, name: str, version: int | None, label: str | None) -> dict[str, Any]:
        """GET /v1/models/{m}: the state of every version, or of the one asked for (failed ones too)."""
        return model_status(self.manager, name, version, label)


def _request_doc(body: bytes | bytearray | str | dict) -> dict[str, Any]:
    """A REST request body as its JSON object (a dict passes as it is: arrays from handlers)."""
    doc = json_codec.parse_json(body) if isinstance(body, (bytes, bytearray, str)) else body
    if not isinstance(doc, dict):
        raise InvalidArgument(
            "Request body must be a JSON object such as "
            '{"instances": [...]}, {"inputs": ...} or {"examples": [...]}'
        )
    return doc


def signature_def_map(meta_graph_def: Any) -> dict[str, Any]:
    """A MetaGraphDef's signatures as TF Serving prints a SignatureDefMap in JSON."""
    return json_format.MessageToDict(
        signature_def_map_proto(meta_graph_def),
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


def signature_def_map_proto(meta_graph_def: Any) -> Any:
    """A MetaGraphDef's signatures as TF Serving's SignatureDefMap proto."""
    from tensorflow_serving.apis import get_model_metadata_pb2

    sig_map = get_model_metadata_pb2.SignatureDefMap()
    for key, sig in meta_graph_def.signature_def.items():
        sig_map.signature_def[key].CopyFrom(sig)
    return sig_map
