"""Load a SavedModel version and run its signatures on numpy arrays.

Like TF Serving's C++ loader, each model gets its own graph and session and every signature
runs through a cached C++ session callable (thread-safe, releases the GIL, tens of µs a call).
TF1 graph and TF2 object-graph SavedModels both load this way; variables a TF2 model's
signatures read but its saver_def skips (Keras 3) are restored from the checkpoint by object.
A TF2 model that still cannot run in a Session falls back, per model and at load time, to
`tf.saved_model.load` and its signature functions (`LoadedModel.fallback_reason` says why).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, saved_model_pb2

from tfservo.core.errors import (
    Code,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    ModelLoadError,
    NotFound,
    ResourceExhausted,
    ServingError,
    Unavailable,
    Unimplemented,
)
from tfservo.core.errors import (
    first_line as _first_line,
)
from tfservo.core.running import RunningCalls
from tfservo.core.settings import INTER_OP_IN_CALLER_THREAD
from tfservo.models import QUIET_TENSORFLOW  # sets TF_CPP_MIN_LOG_LEVEL before TF loads
from tfservo.models.captured_variables import UnrestorableVariables, restore_captured_variables
from tfservo.models.profiling import annotation
from tfservo.models.session_callable import make_session_callable
from tfservo.models.signatures import SignatureDef, TensorSpec, signature_from_proto, tensor_info_name

__all__ = ["INIT_OP_SIGNATURE", "Feeds", "load_saved_model", "LoadedModel", "model_calls"]

# Every model call of this process in progress (any backend, any thread): a worker whose call
# is stuck past its hard limit is replaced (server.recycling.WorkerWatch).
model_calls = RunningCalls()

if QUIET_TENSORFLOW:
    from absl import logging as _absl_logging

    _absl_logging.set_verbosity(_absl_logging.ERROR)
    tf.get_logger().setLevel("ERROR")

log = logging.getLogger("tfservo.models")

INIT_OP_SIGNATURE = "__saved_model_init_op"  # TF2's initializer "signature"; not servable

# TF's canonical codes are ours, so a TF error keeps its kind (OOM stays RESOURCE_EXHAUSTED).
_ERRORS_BY_CODE: dict[Code, type[ServingError]] = {
    Code.INVALID_ARGUMENT: InvalidArgument,
    Code.OUT_OF_RANGE: InvalidArgument,
    Code.NOT_FOUND: NotFound,
    Code.FAILED_PRECONDITION: FailedPrecondition,
    Code.RESOURCE_EXHAUSTED: ResourceExhausted,
    Code.UNIMPLEMENTED: Unimplemented,
    Code.UNAVAILABLE: Unavailable,
}
_FEATURE_TYPES = {types_pb2.DT_FLOAT: "float", types_pb2.DT_INT64: "int64", types_pb2.DT_STRING: "bytes"}

Feeds = dict[str, np.ndarray]
_Runner = Callable[[list[np.ndarray]], list[object]]


def load_saved_model(
    path: str,
    *,
    tags: Sequence[str] = ("serve",),
    intra_op_threads: int = 0,
    inter_op_threads: int = INTER_OP_IN_CALLER_THREAD,
    strict_shapes: bool = False,
) -> LoadedModel:
    """Load the SavedModel in directory `path` (the MetaGraph tagged `tags`); raises ModelLoadError.

    `strict_shapes` rejects inputs whose rank or fixed dims differ from the signature before
    running. It is off by default because TF Serving does not check (half_plus_two's x is
    [-1, 1], yet `{"instances": [1.0, 2.0, 5.0]}` works there); TF's own shape errors still
    come back as InvalidArgument naming the input.
    """
    path = str(path)
    _check_layout(path)
    config = config_pb2.ConfigProto(
        intra_op_parallelism_threads=intra_op_threads,
        inter_op_parallelism_threads=inter_op_threads,
        allow_soft_placement=True,
    )
    config.gpu_options.allow_growth = True  # many models share one GPU
    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph, config=config)
    try:
        with graph.as_default():
            meta_graph_def = tf.compat.v1.saved_model.loader.load(session, list(tags), path)
    except Exception as graph_exc:
        session.close()
        meta_graph_def = _read_meta_graph(path, tags)
        if not meta_graph_def.object_graph_def.nodes:
            raise ModelLoadError(
                f"Failed to load SavedModel at {path}: {_first_line(graph_exc)}. "
                "Check that the export is complete and was written by a compatible TensorFlow"
            ) from None
        return _fall_back_to_functions(path, tags, strict_shapes, _first_line(graph_exc))
    problem = _session_problem(session, meta_graph_def, path)
    if problem is not None:
        session.close()
        return _fall_back_to_functions(path, tags, strict_shapes, problem)
    return LoadedModel(path, meta_graph_def, _SessionBackend(session), strict_shapes=strict_shapes)


def _session_problem(
    session: tf.compat.v1.Session, meta_graph_def: meta_graph_pb2.MetaGraphDef, path: str
) -> str | None:
    """Why a TF2 model cannot run in `session` even after restoring what its saver_def missed; None if it can.

    TF1 graphs (no object graph) have no other way to run, so they are never refused here.
    """
    if not meta_graph_def.object_graph_def.nodes:
        return None
    names = [name for name in meta_graph_def.signature_def if name != INIT_OP_SIGNATURE]
    for name in names:
        proto = meta_graph_def.signature_def[name]
        for info in [*proto.inputs.values(), *proto.outputs.values()]:
            try:
                session.graph.get_tensor_by_name(tensor_info_name(info))
            except (KeyError, ValueError):
                return f"signature '{name}' names tensor '{tensor_info_name(info)}', which its graph lacks"
    try:
        restored = restore_captured_variables(session, meta_graph_def, path, names)
    except (UnrestorableVariables, tf.errors.OpError) as exc:
        return _first_line(exc)
    if restored:  # what Keras 3 exports need, every time: DEBUG, not an operator's concern
        log.debug(
            "SavedModel at %s: restored %d variable(s) its signatures read from the checkpoint; its "
            "saver_def does not restore them (as with Keras 3 models saved by tf.saved_model.save)",
            path,
            len(restored),
        )
    return None


def _fall_back_to_functions(path: str, tags: Sequence[str], strict_shapes: bool, reason: str) -> LoadedModel:
    """Load a TF2 model that cannot run in a Session with tf.saved_model.load; `reason` says why."""
    try:
        model = _load_with_functions(path, tags=tags, strict_shapes=strict_shapes)
    except Exception as fn_exc:
        raise ModelLoadError(
            f"Failed to load SavedModel at {path}: as a graph: {reason}; "
            f"as TF2 functions: {_first_line(fn_exc)}. "
            "Check that the export is complete and was written by a compatible TensorFlow"
        ) from None
    model.fallback_reason = reason
    return model


def _load_with_functions(
    path: str, *, tags: Sequence[str] = ("serve",), strict_shapes: bool = False
) -> LoadedModel:
    """The fallback for TF2 models: tf.saved_model.load, run through the signature functions."""
    meta_graph_def = _read_meta_graph(path, tags)
    loaded = tf.saved_model.load(path, tags=list(tags))
    return LoadedModel(path, meta_graph_def, _FunctionBackend(loaded), strict_shapes=strict_shapes)


class LoadedModel:
    """One loaded SavedModel version: its signatures, and `run` to execute them (thread-safe)."""

    def __init__(
        self,
        path: str,
        meta_graph_def: meta_graph_pb2.MetaGraphDef,
        backend: _Backend,
        *,
        strict_shapes: bool = False,
    ) -> None:
        self.path = path
        self.signatures = {
            name: signature_from_proto(name, proto)
            for name, proto in sorted(meta_graph_def.signature_def.items())
            if name != INIT_OP_SIGNATURE
        }
        self.meta_graph_def = meta_graph_def
        self.strict_shapes = strict_shapes
        # Why this model runs through tf.saved_model.load instead of a Session; None when it doesn't.
        self.fallback_reason: str | None = None
        self.keras_file: str | None = None  # the .keras file this SavedModel was exported from, if one was
        self._backend = backend
        self._runners: dict[tuple[str, tuple[str, ...], tuple[str, ...]], _Runner] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._feature_types: dict[str, str] | None = None
        # Coerce to the graph's dtype: a signature may misstate it (half_plus_three's regress
        # declares DT_FLOAT for its serialized-Example input).
        self._input_dtypes = {
            (sig.name, key): backend.input_dtype(sig, key)
            for sig in self.signatures.values()
            for key in sig.inputs
        }
        self._defaults = {
            name: {k: tf.make_ndarray(v) for k, v in proto.defaults.items()}
            for name, proto in meta_graph_def.signature_def.items()
            if name in self.signatures and getattr(proto, "defaults", None)
        }
        # Per signature, its inputs' numpy dtypes when every input is numeric: arrays already of
        # those dtypes (what the decoders and the batcher hand over) are fed as they are.
        self._ready = {
            sig.name: {key: np.dtype(self._input_dtypes[(sig.name, key)].as_numpy_dtype) for key in sig.inputs}
            for sig in self.signatures.values()
            if sig.inputs and all(_plain_numeric(self._input_dtypes[(sig.name, key)]) for key in sig.inputs)
        }

    @property
    def backend(self) -> str:
        """"session" (graph + session callables) or "function" (tf.saved_model.load fallback)."""
        return self._backend.kind

    def run(
        self,
        signature_name: str,
        inputs: Mapping[str, object],
        output_keys: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run a signature on `inputs` (key → array) and return the outputs (all, or `output_keys`)."""
        sig = self.signatures.get(signature_name)
        if sig is None:
            raise InvalidArgument(
                f"Serving signature name: '{signature_name}' not found in signature def; "
                f"available signatures: {', '.join(sorted(self.signatures)) or 'none'}"
            )
        ready = None if self.strict_shapes else self._ready.get(sig.name)
        feeds: Feeds
        if ready is not None and _fed_as_is(inputs, ready):
            feeds, in_keys = inputs, tuple(ready)  # the signature's order: one runner whatever the caller's
        else:
            feeds = self._feeds(sig, inputs)
            in_keys = tuple(feeds)
        out_keys = tuple(sig.outputs) if output_keys is None else tuple(output_keys)
        for key in out_keys if output_keys is not None else ():  # the signature's own need no check
            if key not in sig.outputs:
                raise InvalidArgument(
                    f"Output tensor alias '{key}' not found in signature '{sig.name}'; "
                    f"outputs are: {', '.join(sig.outputs)}"
                )
        if self._closed:
            raise FailedPrecondition(f"Model at {self.path} has been unloaded; retry the request")
        runner = self._runners.get((sig.name, in_keys, out_keys))
        if runner is None:
            runner = self._make_runner(sig, in_keys, out_keys)
        call = model_calls.begin()
        try:
            with annotation("tfservo.run", signature=sig.name, model=self.path):
                values = runner([feeds[k] for k in in_keys])
        except tf.errors.OpError as exc:
            raise self._run_error(sig, feeds, exc.error_code, exc.message) from None
        except (TypeError, ValueError) as exc:
            raise self._run_error(sig, feeds, Code.INVALID_ARGUMENT, str(exc)) from None
        finally:
            model_calls.end(call)
        return {key: _to_numpy(value, sig.outputs[key]) for key, value in zip(out_keys, values)}

    def example_feature_types(self) -> dict[str, str]:
        """Feature name → "float" | "int64" | "bytes" from the graph's ParseExample ops; {} if none."""
        if self._feature_types is None:
            try:
                self._feature_types = _example_feature_types(self.meta_graph_def.graph_def)
            except Exception:
                self._feature_types = {}
        return dict(self._feature_types)

    def close(self) -> None:
        """Release the session (or functions); later `run` calls fail with FailedPrecondition."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._runners.clear()
            self._backend.close()

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LoadedModel({self.path!r}, signatures={sorted(self.signatures)})"

    def _feeds(self, sig: SignatureDef, inputs: Mapping[str, object]) -> Feeds:
        defaults = self._defaults.get(sig.name, {})
        extra = sorted(set(inputs) - set(sig.inputs))
        missing = sorted(set(sig.inputs) - set(inputs) - set(defaults))
        if extra or missing:
            problems = []
            if missing:
                problems.append(f"missing {', '.join(missing)}")
            if extra:
                problems.append(f"unexpected {', '.join(extra)}")
            raise InvalidArgument(
                f"Signature '{sig.name}' inputs do not match: {'; '.join(problems)}. "
                f"Expected inputs: {', '.join(sig.inputs) or 'none'}"
            )
        feeds = {}
        for key, spec in sig.inputs.items():
            if key in inputs:
                value = _coerce(sig.name, spec, self._input_dtypes[(sig.name, key)], inputs[key])
            else:
                value = defaults[key]
            if self.strict_shapes and not _shape_fits(spec.shape, value.shape):
                raise InvalidArgument(_shape_message(sig.name, spec, value.shape))
            feeds[key] = value
        return feeds

    def _make_runner(self, sig: SignatureDef, in_keys: tuple[str, ...], out_keys: tuple[str, ...]) -> _Runner:
        with self._lock:
            if self._closed:
                raise FailedPrecondition(f"Model at {self.path} has been unloaded; retry the request")
            cache_key = (sig.name, in_keys, out_keys)
            runner = self._runners.get(cache_key)
            if runner is None:
                try:
                    runner = self._backend.runner(sig, in_keys, out_keys)
                except (tf.errors.OpError, ValueError, KeyError) as exc:
                    raise Internal(
                        f"Cannot prepare signature '{sig.name}' of the model at {self.path}: "
                        f"{_first_line(exc)}; the SavedModel's signature does not match its graph"
                    ) from None
                self._runners[cache_key] = runner
            return runner

    def _run_error(self, sig: SignatureDef, feeds: Feeds, code: int, message: str) -> ServingError:
        text = f"{_first_line(message)} (while running signature '{sig.name}')"
        # Point at the input whose shape disagrees with the signature, if there is one.
        bad = [k for k, v in feeds.items() if not _shape_fits(sig.inputs[k].shape, v.shape)]
        if bad:
            text += "; " + "; ".join(_shape_message(sig.name, sig.inputs[k], feeds[k].shape) for k in bad)
        try:
            code = Code(code)
        except ValueError:
            code = Code.UNKNOWN
        return _ERRORS_BY_CODE.get(code, ServingError)(text, code)


class _Backend:
    """How a LoadedModel runs its signatures."""

    kind = ""

    def input_dtype(self, sig: SignatureDef, key: str) -> tf.DType:
        return _dtype(sig.inputs[key].dtype)

    def runner(self, sig: SignatureDef, in_keys: tuple[str, ...], out_keys: tuple[str, ...]) -> _Runner:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _SessionBackend(_Backend):
    """Graph + session; each (signature, inputs, outputs) becomes a C++ session callable."""

    kind = "session"

    def __init__(self, session: tf.compat.v1.Session) -> None:
        self.session = session

    def input_dtype(self, sig: SignatureDef, key: str) -> tf.DType:
        try:
            return self.session.graph.get_tensor_by_name(sig.inputs[key].tensor_name).dtype.base_dtype
        except (KeyError, ValueError):
            return super().input_dtype(sig, key)

    def runner(self, sig: SignatureDef, in_keys: tuple[str, ...], out_keys: tuple[str, ...]) -> _Runner:
        options = config_pb2.CallableOptions()
        options.feed.extend(sig.inputs[k].tensor_name for k in in_keys)
        options.fetch.extend(sig.outputs[k].tensor_name for k in out_keys)
        callable_ = make_session_callable(self.session, options)
        return lambda values: callable_(*values)

    def close(self) -> None:
        self.session.close()


class _FunctionBackend(_Backend):
    """A TF2 model loaded with tf.saved_model.load, run through its signature functions (eager)."""

    kind = "function"

    def __init__(self, loaded: Any) -> None:
        self.loaded = loaded

    def input_dtype(self, sig: SignatureDef, key: str) -> tf.DType:
        try:
            return self.loaded.signatures[sig.name].structured_input_signature[1][key].dtype
        except (KeyError, IndexError, AttributeError):
            return super().input_dtype(sig, key)

    def runner(self, sig: SignatureDef, in_keys: tuple[str, ...], out_keys: tuple[str, ...]) -> _Runner:
        function = self.loaded.signatures[sig.name]
        dtypes = {k: self.input_dtype(sig, k) for k in in_keys}

        def run(values: list[np.ndarray]) -> list[object]:
            kwargs = {k: tf.convert_to_tensor(v, dtype=dtypes[k]) for k, v in zip(in_keys, values)}
            result = function(**kwargs)
            return [result[k].numpy() for k in out_keys]

        return run

    def close(self) -> None:
        self.loaded = None


def _check_layout(path: str) -> None:
    """Fail early, and clearly, for paths that cannot hold a SavedModel."""
    root = Path(path)
    if not root.is_dir():
        raise ModelLoadError(
            f"SavedModel directory {path} does not exist or is not a directory; "
            "check the model's base path and version number",
            Code.NOT_FOUND,
        )
    if (root / "saved_model.pb").is_file() or (root / "saved_model.pbtxt").is_file():
        return
    if (root / "export.meta").is_file():
        raise ModelLoadError(
            f"{path} holds a legacy SessionBundle export (export.meta), not a SavedModel; "
            "re-export the model with tf.saved_model.save (TF2) or SavedModelBuilder (TF1)"
        )
    raise ModelLoadError(
        f"No saved_model.pb in {path}; point at a SavedModel version directory "
        "(containing saved_model.pb and variables/)",
        Code.NOT_FOUND,  # TF Serving's code for a dir without a SavedModel
    )


def _read_meta_graph(path: str, tags: Sequence[str]) -> meta_graph_pb2.MetaGraphDef:
    """The MetaGraphDef tagged `tags` in the SavedModel file; ModelLoadError if there is none."""
    root = Path(path)
    saved_model = saved_model_pb2.SavedModel()
    try:
        if (root / "saved_model.pb").is_file():
            saved_model.ParseFromString((root / "saved_model.pb").read_bytes())
        else:
            from google.protobuf import text_format

            text_format.Parse((root / "saved_model.pbtxt").read_text(), saved_model)
    except Exception as exc:
        raise ModelLoadError(
            f"Cannot parse the SavedModel file in {path}: {_first_line(exc)}; "
            "the file is truncated or not a SavedModel",
            Code.DATA_LOSS,  # TF's ReadBinaryProto: "Can't parse ... as binary proto"
        ) from None
    for meta_graph in saved_model.meta_graphs:
        if set(meta_graph.meta_info_def.tags) == set(tags):
            return meta_graph
    available = [sorted(m.meta_info_def.tags) for m in saved_model.meta_graphs]
    raise ModelLoadError(
        f"SavedModel at {path} has no MetaGraph with tags {sorted(tags)}; "
        f"available tag sets: {available}. Load it with one of those tag sets",
        Code.NOT_FOUND,  # TF's "Could not find meta graph def matching supplied tags"
    ) from None


def _shape_fits(expected: tuple[int, ...] | None, got: tuple[int, ...]) -> bool:
    if expected is None:
        return True
    return len(expected) == len(got) and all(e < 0 or e == g for e, g in zip(expected, got))


def _shape_message(sig_name: str, spec: TensorSpec, got: tuple[int, ...]) -> str:
    return (
        f"input '{spec.key}' of signature '{sig_name}' has shape {list(got)} but the signature "
        f"expects {list(spec.shape or ())} (-1 = any size)"
    )


def _dtype(enum_name: str) -> tf.DType:
    return tf.dtypes.as_dtype(types_pb2.DataType.Value(enum_name)).base_dtype


def _plain_numeric(dtype: tf.DType) -> bool:
    """A dtype whose numpy arrays TensorFlow takes as they are (no strings, resources or quantized types)."""
    return bool(dtype.is_bool or dtype.is_integer or dtype.is_floating or dtype.is_complex) and not dtype.is_quantized


def _fed_as_is(inputs: Mapping[str, object], ready: dict[str, np.dtype]) -> TypeGuard[Feeds]:
    """Whether `inputs` are exactly a signature's inputs, each an array of its dtype: what
    `_feeds` would hand over unchanged (its checks cost ~10 µs a call on a request's cold caches)."""
    if type(inputs) is not dict or len(inputs) != len(ready):
        return False
    for key, dtype in ready.items():
        value = inputs.get(key)
        if type(value) is not np.ndarray or value.dtype != dtype:
            return False
    return True


def _coerce(sig_name: str, spec: TensorSpec, dtype: tf.DType, value: object) -> np.ndarray:
    """`value` as an array of `dtype`, converting only when no value changes."""

    def fail(why: str) -> InvalidArgument:
        return InvalidArgument(
            f"Input '{spec.key}' of signature '{sig_name}' expects "
            f"{types_pb2.DataType.Name(dtype.as_datatype_enum)} values; {why}"
        )

    try:
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    except (ValueError, TypeError) as exc:
        why = f"cannot make an array of it ({_first_line(exc)}); rows must all have the same length"
        raise fail(why) from None
    if dtype.as_datatype_enum == types_pb2.DT_STRING:  # DType.__eq__ is Python-level (~1 µs)
        return _coerce_strings(arr, fail)
    if arr.dtype.kind in "USO" and _has_text(arr):
        raise fail("got strings; send numbers")
    target = np.dtype(dtype.as_numpy_dtype)
    if arr.dtype == target:
        return arr
    if arr.dtype.kind == "O":
        try:
            arr = np.asarray(arr.tolist())
        except (ValueError, TypeError) as exc:
            raise fail(f"cannot convert it ({_first_line(exc)})") from None
        if arr.dtype.kind not in "biufc":
            raise fail(f"got {arr.dtype} values")
    kind = arr.dtype.kind
    if dtype.is_bool:
        ok = kind == "b"
    elif dtype.is_integer:
        ok = kind in "iu" or (kind == "f" and _integral(arr))
        if ok and arr.size and kind in "iuf":
            info = np.iinfo(target)
            ok = bool(arr.min() >= info.min and arr.max() <= info.max)
            if not ok:
                raise fail(f"values must lie in [{info.min}, {info.max}]")
    elif dtype.is_floating:
        ok = kind in "iuf"
    elif dtype.is_complex:
        ok = kind in "iufc"
    else:
        return arr  # quantized, resource, variant...: let TensorFlow decide
    if not ok:
        raise fail(f"got {arr.dtype} values, which cannot be converted safely")
    return arr.astype(target)


def _coerce_strings(arr: np.ndarray, fail: Callable[[str], InvalidArgument]) -> np.ndarray:
    if arr.dtype.kind == "S":
        return arr.astype(object)
    if arr.dtype.kind == "U":
        if not arr.size:
            return arr.astype(object)
        encoded: np.ndarray = np.vectorize(lambda s: s.encode("utf-8"), otypes=[object])(arr)
        return encoded
    if arr.dtype.kind != "O":
        raise fail(f"got {arr.dtype} values; send strings or bytes")
    out = np.empty(arr.shape, dtype=object)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, item in enumerate(flat_in):
        if isinstance(item, bytes):
            flat_out[i] = item
        elif isinstance(item, str):
            flat_out[i] = item.encode("utf-8")
        else:
            raise fail(f"got a {type(item).__name__} element; send strings or bytes")
    return out


def _has_text(arr: np.ndarray) -> bool:
    if arr.dtype.kind in "US":
        return True
    return any(isinstance(item, (str, bytes)) for item in arr.reshape(-1))


def _integral(arr: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(arr)) and np.all(np.mod(arr, 1) == 0))


def _to_numpy(value: object, spec: TensorSpec) -> np.ndarray:
    if spec.dtype == "DT_STRING":
        return np.asarray(value, dtype=object)
    return np.asarray(value)


def _example_feature_types(graph_def: Any) -> dict[str, str]:
    """Scan the graph and its functions for Parse*Example ops; first definition of a feature wins."""
    types: dict[str, str] = {}
    for nodes in [graph_def.node, *(f.node_def for f in graph_def.library.function)]:
        by_name = {n.name: n for n in nodes}

        def keys(ref: str, by_name: dict[str, Any] = by_name) -> list[str]:
            node = by_name.get(ref.lstrip("^").split(":")[0])
            while node is not None and node.op == "Identity" and node.input:
                node = by_name.get(node.input[0].lstrip("^").split(":")[0])
            if node is None or node.op != "Const":
                return []
            values = np.asarray(tf.make_ndarray(node.attr["value"].tensor)).reshape(-1)
            return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]

        def add(names: list[str], dtypes: Sequence[int]) -> None:
            for name, dtype in zip(names, dtypes):
                if dtype in _FEATURE_TYPES:
                    types.setdefault(name, _FEATURE_TYPES[dtype])

        for node in nodes:
            data_inputs = [i for i in node.input if not i.startswith("^")]
            attr = node.attr
            if node.op == "ParseExample":
                n_sparse, n_dense = attr["Nsparse"].i, attr["Ndense"].i
                sparse = [k for ref in data_inputs[2 : 2 + n_sparse] for k in keys(ref)]
                dense = [k for ref in data_inputs[2 + n_sparse : 2 + n_sparse + n_dense] for k in keys(ref)]
                add(dense, attr["Tdense"].list.type)
                add(sparse, attr["sparse_types"].list.type)
            elif node.op == "ParseExampleV2" and len(data_inputs) >= 5:
                add(keys(data_inputs[3]), attr["Tdense"].list.type)
                add(keys(data_inputs[2]), attr["sparse_types"].list.type)
                add(keys(data_inputs[4]), attr["ragged_value_types"].list.type)
            elif node.op == "ParseSingleExample":
                add([k.decode() for k in attr["dense_keys"].list.s], attr["Tdense"].list.type)
                add([k.decode() for k in attr["sparse_keys"].list.s], attr["sparse_types"].list.type)
    return types
