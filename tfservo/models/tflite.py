"""TFLite models: a version dir holding `model.tflite`, served as TF Serving serves it.

The model runs in TensorFlow's own TFLite interpreter (`tf.lite.Interpreter`, no extra
package). Its signature runners become the version's signatures (method `predict`, shapes from
`shape_signature`, so a -1 batch dim is resized per call). A model without signature runners uses
the SignatureDefs TF Serving's converter stores in its `signature_defs_metadata` (keys mapped to
tensors by name), or else `serving_default` over its input and output tensors, named as they are. An
interpreter runs one call at a time, so a version holds a pool of
`--num_tflite_interpreters_per_pool` of them, each with the intra-op thread count
(`--num_tflite_pools` has no equivalent: one pool per version).
"""

from __future__ import annotations

import os
import queue
import warnings
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from tfservo.core.errors import Code, InvalidArgument, ModelLoadError
from tfservo.models.bundle import TFLITE_MODEL_FILE
from tfservo.models.savedmodel import LoadedModel, _Backend, _Runner
from tfservo.models.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, SignatureDef

__all__ = ["TFLITE_MODEL_FILE", "load_tflite_model"]


def load_tflite_model(path: str, *, interpreters: int = 1, threads: int = 0) -> LoadedModel:
    """Load `path`/model.tflite into `interpreters` interpreters; raises ModelLoadError."""
    model_file = os.path.join(path, TFLITE_MODEL_FILE)
    if not os.path.isfile(model_file):
        raise ModelLoadError(f"No {TFLITE_MODEL_FILE} in {path}; put the converted model there", Code.NOT_FOUND)
    pool: queue.Queue[object] = queue.Queue()
    try:
        for _ in range(max(interpreters, 1)):
            pool.put(_interpreter(model_file, threads))
    except (ValueError, RuntimeError) as exc:
        raise ModelLoadError(
            f"Failed to load TFLite model {model_file}: {str(exc).strip().splitlines()[0]}; "
            "check that it was written by tf.lite.TFLiteConverter and is complete"
        ) from None
    backend = _TfliteBackend(pool, model_file)
    return LoadedModel(path, backend.meta_graph_def(), backend)


def _interpreter(model_file: str, threads: int) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "tf.lite.Interpreter is deprecated": see docs/decisions.md
        interpreter = tf.lite.Interpreter(model_path=model_file, num_threads=threads or None)
    interpreter.allocate_tensors()
    return interpreter


class _TfliteBackend(_Backend):
    """Signature runners over a pool of interpreters, one call per interpreter at a time."""

    kind = "tflite"

    def __init__(self, pool: queue.Queue[Any], model_file: str) -> None:
        self.pool = pool
        first = pool.get()
        try:
            self.signatures = _signature_specs(first, model_file)
            self.has_runners = bool(first.get_signature_list())  # else: fed tensor by tensor
        finally:
            pool.put(first)
        self.fed_shapes: dict[tuple[int, int], tuple[int, ...]] = {}  # (interpreter, tensor) → shape now

    def meta_graph_def(self) -> meta_graph_pb2.MetaGraphDef:
        """The signatures as TF Serving reports a TFLite model's: SignatureDefs, method predict."""
        meta = meta_graph_pb2.MetaGraphDef()
        for name, (inputs, outputs) in self.signatures.items():
            proto = meta.signature_def[name]
            proto.method_name = PREDICT_METHOD
            for target, details in ((proto.inputs, inputs), (proto.outputs, outputs)):
                for key, detail in details.items():
                    info = target[key]
                    info.name = detail["name"]
                    info.dtype = tf.as_dtype(detail["dtype"]).as_datatype_enum
                    for size in detail["shape_signature"]:
                        info.tensor_shape.dim.add(size=int(size))
        return meta

    def runner(self, sig: SignatureDef, in_keys: tuple[str, ...], out_keys: tuple[str, ...]) -> _Runner:
        inputs, outputs = self.signatures[sig.name]

        def run(values: list[np.ndarray]) -> list[Any]:
            interpreter = self.pool.get()
            try:
                if self.has_runners:
                    answer = interpreter.get_signature_runner(sig.name)(**dict(zip(in_keys, values)))
                    result = {key: np.array(value) for key, value in answer.items()}
                else:
                    result = self._feed_tensors(interpreter, inputs, outputs, dict(zip(in_keys, values)))
            except (ValueError, RuntimeError) as exc:
                raise InvalidArgument(
                    f"{str(exc).strip().splitlines()[0]} (while running TFLite signature '{sig.name}'); "
                    f"expected inputs: {_describe(inputs)}"
                ) from None
            finally:
                self.pool.put(interpreter)
            return [result[key] for key in out_keys]

        return run

    def _feed_tensors(
        self, interpreter: Any, inputs: dict[str, Any], outputs: dict[str, Any], feeds: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """A model without signature runners: set each input tensor (resized to the value's
        shape, any rank, as TF Serving feeds it), invoke, read the outputs."""
        for key, value in feeds.items():
            index = inputs[key]["index"]
            if self.fed_shapes.get((id(interpreter), index), tuple(inputs[key]["shape"])) != value.shape:
                interpreter.resize_tensor_input(index, value.shape)
                interpreter.allocate_tensors()
                self.fed_shapes[(id(interpreter), index)] = value.shape
            interpreter.set_tensor(index, value)
        interpreter.invoke()
        return {key: interpreter.get_tensor(detail["index"]) for key, detail in outputs.items()}

    def close(self) -> None:
        while not self.pool.empty():
            self.pool.get_nowait()


def _signature_specs(interpreter: Any, model_file: str) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Signature name → (input key → tensor details, output key → tensor details)."""
    listed = interpreter.get_signature_list()
    if listed:
        specs = {}
        for name in listed:
            runner = interpreter.get_signature_runner(name)
            specs[name] = (runner.get_input_details(), runner.get_output_details())
        return specs
    inputs = {d["name"]: d for d in interpreter.get_input_details()}
    outputs = {d["name"]: d for d in interpreter.get_output_details()}
    stored = _stored_signature_defs(model_file)
    if stored:
        def by_tensor(infos: Any, tensors: dict[str, Any], name: str) -> dict[str, Any]:
            found = {}
            for key, info in infos.items():
                tensor = info.name.removesuffix(":0")
                if tensor not in tensors:
                    raise ModelLoadError(
                        f"TFLite model {model_file}: signature {name} names tensor {info.name}, which the "
                        f"model does not have as an input or output; tensors: {', '.join(tensors)}"
                    )
                found[key] = tensors[tensor]
            return found

        return {
            name: (by_tensor(sig.inputs, inputs, name), by_tensor(sig.outputs, outputs, name))
            for name, sig in stored.items()
        }
    return {DEFAULT_SIGNATURE: (inputs, outputs)}  # keyed by tensor name


def _stored_signature_defs(model_file: str) -> dict[str, Any]:
    """The SignatureDefs in the model's `signature_defs_metadata` (a FlexBuffer map of name →
    serialized SignatureDef, as TF Serving's TFLite tooling writes them); {} if there are none."""
    from flatbuffers import flexbuffers
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(model_file)
    for metadata in model.metadata or ():
        if metadata.name == b"signature_defs_metadata":
            root = flexbuffers.GetRoot(bytes(model.buffers[metadata.buffer].data)).AsMap
            found = {}
            for key, value in zip(root.Keys, root.Values):
                proto = meta_graph_pb2.SignatureDef()
                proto.ParseFromString(bytes(value.AsBlob if value.IsBlob else value.AsStringBytes))
                found[key.AsKey] = proto
            return found
    return {}


def _describe(details: dict[str, Any]) -> str:
    return ", ".join(
        f"{key} {tf.as_dtype(d['dtype']).name}{list(int(s) for s in d['shape_signature'])}" for key, d in details.items()
    )
