"""Keras 3 `.keras` files: a version dir holding one `*.keras` file, served as its SavedModel.

The file is read twice. First by `keras_findings`, without Keras: its config.json is walked for
what can run code or read files on load (Lambda layers, classes from outside Keras, vocabulary
paths), and a finding refuses the load unless --trust-model-code — Keras's own safe_mode has been
bypassed before (CVE-2025-1550), so this does not depend on it alone. Then by Keras itself
(`keras.saving.load_model`, safe_mode on unless trusted) and written once as a SavedModel by
Keras's own `model.export(format="tf_saved_model")` — the artifact a Keras user would give TF
Serving, so its `serving_default` signature is Keras's (inputs named by the input layers, outputs
by a dict's keys or `output_0`…) — in a scratch dir, removed once it has loaded. The version then loads as that
SavedModel: batching, warmup, metadata and the session fast path are the SavedModel's own.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfservo.core.errors import Code, ModelLoadError, first_line
from tfservo.core.scratch import make_scratch_dir
from tfservo.core.settings import INTER_OP_IN_CALLER_THREAD, option

if TYPE_CHECKING:
    from tfservo.models.savedmodel import LoadedModel

__all__ = ["KerasFinding", "export_keras", "keras_findings", "load_keras_file", "load_keras_model"]

_CONFIG = "config.json"
_MAX_CONFIG_BYTES = 64 * 2**20  # a model's architecture; more is an archive built to exhaust memory
_LOOKUPS = ("StringLookup", "IntegerLookup", "TextVectorization")


@dataclass(frozen=True)
class KerasFinding:
    """Something a `.keras` file would do on load beyond restoring layers and weights."""

    layer: str  # the layer's name in the model ("" when the object is not a layer)
    what: str  # one sentence: what it is and why it matters
    trusted_by_flag: bool = True  # --trust-model-code loads it (False: code that must be registered first)

    def __str__(self) -> str:
        return f"layer '{self.layer}': {self.what}" if self.layer else self.what


def keras_findings(path: str, registered: Callable[[str], bool] = lambda name: False) -> list[KerasFinding]:
    """What `path` (a `.keras` file) would run or read on load, from its config.json alone; a
    class from outside Keras that `registered(its registered name)` says is already registered
    (by the bundle's code, or a package that was imported) is code of this process, not the model's."""
    config = _read_config(path)
    found: list[KerasFinding] = []
    for node, layer in _objects(config, ""):
        name, module = node.get("class_name"), node.get("module")
        registered_name = node.get("registered_name")
        if not isinstance(name, str):
            continue
        if name == "__lambda__":
            if any(f.layer == layer and f.what.startswith("a Lambda layer") for f in found):
                continue  # the Lambda layer's own function: already said
            found.append(KerasFinding(layer, "a Python lambda stored as bytecode, run by the model"))
        elif name.startswith("__"):  # Keras's own markers: tensors, arrays, type specs in the config
            continue
        elif name == "Lambda":
            found.append(KerasFinding(layer, "a Lambda layer, whose function is Python code run by the model"))
        elif not (isinstance(module, str) and _from_keras(module)):
            if isinstance(registered_name, str) and registered_name and registered(registered_name):
                continue  # code of this process (the bundle's code/, an imported package), not the model's
            shown = registered_name if isinstance(registered_name, str) and registered_name else name
            where = f" from module {module}, outside Keras," if isinstance(module, str) and module else ""
            # Keras imports classes from its own packages only, so no flag loads this: registering it does
            found.append(KerasFinding(layer, f"class {shown}{where} which nothing here registered: code the model "
                                             "needs and does not carry (define it in the bundle's code/inference.py "
                                             "with @keras.saving.register_keras_serializable())",
                                      trusted_by_flag=False))
        elif name in _LOOKUPS:
            settings = node.get("config")
            vocabulary = settings.get("vocabulary") if isinstance(settings, dict) else None
            if isinstance(vocabulary, str):
                found.append(KerasFinding(layer, f"a {name} whose vocabulary is the path {vocabulary!r}, a file "
                                                 "read from outside the model on load"))
    return found


def load_keras_model(path: str, keras_file: str, *, trust_code: bool = False, intra_op_threads: int = 0,
                     inter_op_threads: int = INTER_OP_IN_CALLER_THREAD) -> LoadedModel:
    """The version in `path` from its `keras_file`, as a LoadedModel (see the module); raises
    ModelLoadError naming the file and, for a refusal, the finding and the flag that allows it."""
    from tfservo.models.savedmodel import load_saved_model

    scratch = make_scratch_dir("tfservo-keras-")
    try:
        export = os.path.join(scratch, "1")
        export_keras(keras_file, export, trust_code=trust_code)
        loaded = load_saved_model(export, intra_op_threads=intra_op_threads, inter_op_threads=inter_op_threads)
    finally:  # read only while it loads (graph, variables, assets): not one copy per version until exit
        shutil.rmtree(scratch, ignore_errors=True)
    loaded.path = path  # what status and errors name: the user's version dir
    loaded.keras_file = keras_file
    return loaded


def export_keras(keras_file: str, target: str, *, trust_code: bool = False, model: Any = None) -> None:
    """Write `keras_file`'s model (`model` where it is loaded already) to `target` as a SavedModel
    (Keras's `model.export`)."""
    if model is None:
        model = load_keras_file(keras_file, trust_code)
    try:
        model.export(target, format="tf_saved_model", verbose=False)
    except Exception as exc:
        raise ModelLoadError(
            f"Failed to serve {keras_file}: Keras could not trace the model for serving: {first_line(exc)}. "
            "A model built from keras.Input layers (Sequential or functional) traces; a subclassed model "
            "must have been built (called once) before it was saved"
        ) from None


def load_keras_file(keras_file: str, trust_code: bool = False) -> Any:
    """The Keras model in `keras_file`, loaded safely unless `trust_code` (refusals as in the module)."""
    import keras

    if not trust_code:
        found = keras_findings(keras_file, lambda name: keras.saving.get_registered_object(name) is not None)
        if found:
            listed = "; ".join(str(f) for f in found)
            allow = _allow_hint() if any(f.trusted_by_flag for f in found) else ""
            raise ModelLoadError(
                f"Refusing to load {keras_file}: it runs code or reads files on load ({listed}).{allow}",
                Code.FAILED_PRECONDITION,
            )
    if keras.config.backend() != "tensorflow":
        raise ModelLoadError(
            f"Cannot serve {keras_file} on Keras's {keras.config.backend()} backend: tfservo serves Keras models "
            "on TensorFlow; unset KERAS_BACKEND (or set it to tensorflow)"
        )
    try:
        return keras.saving.load_model(keras_file, compile=False, safe_mode=not trust_code)
    except Exception as exc:
        message = first_line(exc)
        if "Could not locate" in str(exc):
            missing = str(exc).split("Could not locate", 1)[1].split(".")[0].strip()
            raise ModelLoadError(
                f"Failed to load {keras_file}: Keras could not locate {missing}: a custom object the model "
                "needs. Define it in the bundle's code/inference.py with @keras.saving.register_keras_serializable() "
                "(the bundle's code is imported before its models load)"
            ) from None
        raise ModelLoadError(
            f"Failed to load {keras_file}: {message}. Check that it was written by model.save() of Keras 3 "
            "and is complete"
        ) from None


def _read_config(path: str) -> dict[str, object]:
    try:
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo(_CONFIG)
            if info.file_size > _MAX_CONFIG_BYTES:
                raise ModelLoadError(f"Refusing to load {path}: its {_CONFIG} would be {info.file_size} bytes")
            config = json.loads(archive.read(info))
    except KeyError:
        raise ModelLoadError(f"Failed to load {path}: no {_CONFIG} in it; a .keras file is written by "
                             "model.save('model.keras')") from None
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ModelLoadError(f"Failed to load {path}: not a readable .keras file ({first_line(exc)}); "
                             "write it with model.save('model.keras')") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"Failed to load {path}: its {_CONFIG} is not an object")
    return config


def _objects(node: object, layer: str) -> Iterator[tuple[dict[str, object], str]]:
    """Every serialized object in a Keras config (dicts with a class_name), with its layer's name."""
    if isinstance(node, dict):
        if "class_name" in node:
            config = node.get("config")
            name = node.get("name") or (config.get("name") if isinstance(config, dict) else None)
            layer = name if isinstance(name, str) and name else layer
            yield node, layer
        for value in node.values():
            yield from _objects(value, layer)
    elif isinstance(node, list):
        for value in node:
            yield from _objects(value, layer)


def _from_keras(module: str) -> bool:
    root = module.split(".", 1)[0]
    return root in ("keras", "keras_hub", "keras_nlp", "keras_cv")


def _allow_hint() -> str:
    """How to allow what a finding names, from the setting's own declaration."""
    trust = option("trust_model_code")
    return (f" Allow it with {trust.flags[0]} (serve, export), or {trust.env[0]}=true for any command or engine "
            "(a transform's --env too), if you trust where it came from")
