"""`tfservo export`: a `.keras` file written as the SavedModel TF Serving and the SageMaker container
serve, and checked: Keras and the SavedModel's `serving_default` are run on the same generated
rows and their outputs compared within a tolerance, so the user sees the export answers as their
model does before they ship it.

The SavedModel is written beside the target and renamed into place only once it has passed, so a
failed export leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfservo.core.errors import ModelLoadError, first_line
from tfservo.models.bundle import KERAS_SUFFIX, keras_file

__all__ = ["ExportCheck", "export_checked", "keras_source"]


@dataclass(frozen=True)
class ExportCheck:
    """What an export wrote and how its answers compared with Keras's."""

    keras_file: str
    target: str
    rows: int
    inputs: dict[str, str]  # signature input → "dtype shape"
    diffs: dict[str, float]  # signature output → max |keras - savedmodel|
    worst: dict[str, float]  # signature output → max of |diff| / (atol + rtol·|keras|): ≤ 1 passes
    rtol: float
    atol: float

    @property
    def ok(self) -> bool:
        return all(value <= 1.0 for value in self.worst.values())

    def lines(self) -> list[str]:
        """The report `tfservo export` prints."""
        out = [f"exported {self.keras_file} to {self.target} (a SavedModel with Keras's serving_default signature)"]
        out += [f"  input  {name}: {spec}" for name, spec in self.inputs.items()]
        out.append(f"checked on {self.rows} generated rows, tolerance |keras - savedmodel| <= "
                   f"{self.atol:g} + {self.rtol:g}·|keras|:")
        for name, diff in self.diffs.items():
            verdict = "within tolerance" if self.worst[name] <= 1.0 else "OUTSIDE tolerance"
            out.append(f"  output {name}: max |diff| {diff:.3g} ({verdict})")
        return out


def keras_source(path: str) -> str:
    """The `.keras` file `path` names: the file itself, or a version dir's one `.keras` file."""
    if os.path.isfile(path) and path.endswith(KERAS_SUFFIX):
        return path
    if os.path.isdir(path):
        found = keras_file(path)
        if found is not None:
            return found
    raise ModelLoadError(f"{path} is not a {KERAS_SUFFIX} file or a version dir holding one; "
                         "give the file model.save('model.keras') wrote, or its version dir")


def export_checked(source: str, target: str, *, trust_code: bool = False, rows: int = 8,
                   rtol: float = 1e-5, atol: float = 1e-5, seed: int = 0) -> ExportCheck:
    """Export `source` (see keras_source) to `target` and compare both on `rows` generated rows;
    `target` is written only when every output is within the tolerance (else ModelLoadError)."""
    from tfservo.models.keras_model import export_keras, load_keras_file

    keras_path = keras_source(source)
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise ModelLoadError(f"{target} already exists; export writes a new SavedModel dir (remove it or name another)")
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".{os.path.basename(os.path.abspath(target))}.export-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        model = load_keras_file(keras_path, trust_code)
        export_keras(keras_path, staging, trust_code=trust_code, model=model)
        check = _compare(keras_path, target, model, staging, rows, rtol, atol, seed)
        if not check.ok:
            raise ModelLoadError("\n".join([*check.lines(), "not written: the SavedModel's answers differ from "
                                            "Keras's beyond the tolerance (--rtol/--atol widen it)"]))
        if os.path.isdir(target):
            os.rmdir(target)  # empty, checked above
        os.replace(staging, target)
        return check
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _compare(keras_path: str, target: str, model: Any, exported: str, rows: int, rtol: float, atol: float,
             seed: int) -> ExportCheck:
    import tensorflow as tf

    serving = tf.saved_model.load(exported).signatures["serving_default"]
    specs: Mapping[str, Any] = serving.structured_input_signature[1]
    rng = np.random.default_rng(seed)
    sample = {name: _sample(spec, rows, rng) for name, spec in specs.items()}
    try:
        theirs = {k: np.asarray(v) for k, v in serving(**{k: tf.constant(v) for k, v in sample.items()}).items()}
        ours = _keras_outputs(model, sample, sorted(theirs))
    except Exception as exc:
        raise ModelLoadError(f"Failed to check the export of {keras_path} on generated rows: {first_line(exc)}") from None
    diffs: dict[str, float] = {}
    worst: dict[str, float] = {}
    for name in sorted(theirs):
        want, got = ours[name], theirs[name]
        if want.shape != got.shape:
            raise ModelLoadError(f"the export of {keras_path} answers output {name} with shape {got.shape}, "
                                 f"Keras with {want.shape}")
        if want.dtype.kind in "fc":
            diff = np.abs(want.astype(np.float64) - got.astype(np.float64))
            diffs[name] = float(diff.max(initial=0.0))
            worst[name] = float((diff / (atol + rtol * np.abs(want.astype(np.float64)))).max(initial=0.0))
        else:
            same = bool(np.array_equal(want, got))
            diffs[name], worst[name] = (0.0, 0.0) if same else (float("inf"), float("inf"))
    inputs = {name: f"{spec.dtype.name} {tuple(-1 if d is None else d for d in spec.shape)}" for name, spec in specs.items()}
    return ExportCheck(keras_path, target, rows, inputs, diffs, worst, rtol, atol)


def _sample(spec: Any, rows: int, rng: np.random.Generator) -> np.ndarray:
    """`rows` generated values for one signature input: unknown dims other than the batch are 2."""
    shape = [rows] + [2 if d is None else int(d) for d in list(spec.shape)[1:]]
    dtype = spec.dtype
    if dtype.is_floating:
        return rng.standard_normal(shape).astype(dtype.as_numpy_dtype)
    if dtype.is_integer:
        return rng.integers(0, 4, shape).astype(dtype.as_numpy_dtype)
    if dtype.is_bool:
        return rng.integers(0, 2, shape).astype(bool)
    words = np.array([b"a", b"b", b"c", b"red", b"green"], dtype=object)
    return words[rng.integers(0, len(words), shape)]


def _keras_outputs(model: Any, sample: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """Keras's answer for `sample` (keyed by input layer name), keyed as the export keys its outputs:
    a dict's own keys, else output_0, output_1, … in the model's order."""
    import keras

    try:
        struct = model.input  # the inputs as the model was built: one tensor, a list, or a dict by key
    except (AttributeError, ValueError):  # a Sequential model loaded from its config: one input
        struct = None
    args: Any
    if struct is None:
        [args] = sample.values()
    elif isinstance(struct, dict):
        args = {key: sample[tensor.name] for key, tensor in struct.items()}
    elif isinstance(struct, (list, tuple)):
        args = [sample[tensor.name] for tensor in struct]
    else:
        args = sample[struct.name]
    answer = model(args, training=False)
    if isinstance(answer, dict):
        return {key: np.asarray(keras.ops.convert_to_numpy(value)) for key, value in answer.items()}
    flat = answer if isinstance(answer, (list, tuple)) else [answer]
    found = {f"output_{i}": np.asarray(keras.ops.convert_to_numpy(value)) for i, value in enumerate(flat)}
    if sorted(found) != names:
        raise ModelLoadError(f"the export's outputs are {names}, Keras's {sorted(found)}")
    return found
