"""Keras 3 and tf.Module SavedModels written by tf.saved_model.save: loaded, run and served.

tf.saved_model.save of a Keras 3 model leaves the variables its signatures read out of the
saver_def's restore op; the runtime restores them from the checkpoint (see
tfservo/models/captured_variables.py). A model that still cannot run in a Session falls
back to tf.saved_model.load at load time.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from server_process import ServerProcess

from tfservo.core.errors import ModelLoadError
from tfservo.models import load_saved_model

SESSION_MODELS = ["keras_module", "keras_export", "keras_direct", "plain_module", "plain_skip_saver"]
# keras_module and plain_module with the signature's call node cut out of their graphs
FALLBACK_MODELS = {"keras_fallback": "keras_module", "plain_fallback": "plain_module"}


@dataclass
class Case:
    x: np.ndarray
    expected: dict[str, np.ndarray]  # output key → what TensorFlow computes in-process


@dataclass
class Built:
    root: Path
    cases: dict[str, Case]

    def path(self, name: str) -> str:
        return str(self.root / name / "1")


def keras_model():
    """Dense + BatchNormalization + Dropout, with BatchNormalization's statistics far from their defaults."""
    import keras

    keras.utils.set_random_seed(7)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(12, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(3),
        ]
    )
    rng = np.random.default_rng(7)
    bn = model.layers[1]
    bn.set_weights(
        [
            rng.uniform(0.5, 2.0, 12).astype(np.float32),  # gamma
            rng.normal(size=12).astype(np.float32),  # beta
            rng.normal(size=12).astype(np.float32),  # moving_mean (non-trainable)
            rng.uniform(0.5, 3.0, 12).astype(np.float32),  # moving_variance (non-trainable)
        ]
    )
    return model


def save_keras(root: Path, x: np.ndarray) -> dict[str, Case]:
    import tensorflow as tf

    model = keras_model()
    expected = np.asarray(model(x, training=False))

    class Serving(tf.Module):
        def __init__(self, model) -> None:
            super().__init__()
            self.model = model

        @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32)])
        def serve(self, x):
            return {"y": self.model(x, training=False)}

    module = Serving(model)
    signatures = {"serving_default": module.serve}
    tf.saved_model.save(module, str(root / "keras_module" / "1"), signatures=signatures)
    model.export(str(root / "keras_export" / "1"), verbose=False)
    tf.saved_model.save(model, str(root / "keras_direct" / "1"))
    return {
        "keras_module": Case(x, {"y": expected}),
        "keras_export": Case(x, {"output_0": expected}),
        "keras_direct": Case(x, {"output_0": expected}),
    }


def save_plain_modules(root: Path, x: np.ndarray) -> dict[str, Case]:
    import tensorflow as tf

    class Affine(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            rng = np.random.default_rng(3)
            self.w = tf.Variable(rng.normal(size=(6, 2)).astype(np.float32))
            self.b = tf.Variable(rng.normal(size=2).astype(np.float32))
            self.scale = tf.Variable(np.float32(1.5), trainable=False)
            self.offset = tf.Variable(np.int64(40), trainable=False)
            self.unused = tf.Variable(np.zeros(4, np.float32), trainable=False)

        @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32)])
        def serve(self, x):
            y = (tf.matmul(x, self.w) + self.b) * self.scale
            return {"y": y, "n": tf.cast(tf.round(x[:, 0] * 10), tf.int64) + self.offset}

    module = Affine()
    out = {k: v.numpy() for k, v in module.serve(tf.constant(x)).items()}
    signatures = {"serving_default": module.serve}
    tf.saved_model.save(module, str(root / "plain_module" / "1"), signatures=signatures)
    # No saver_def at all: graph loaders restore nothing; every variable comes from the checkpoint.
    options = tf.saved_model.SaveOptions(experimental_skip_saver=True)
    tf.saved_model.save(module, str(root / "plain_skip_saver" / "1"), signatures=signatures, options=options)
    return {"plain_module": Case(x, out), "plain_skip_saver": Case(x, out)}


def cut_signature_call(src: Path, dst: Path) -> None:
    """Copy a SavedModel, dropping the graph node its serving_default outputs come from."""
    from tensorflow.core.protobuf import saved_model_pb2

    shutil.copytree(src, dst)
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((dst / "saved_model.pb").read_bytes())
    graph = saved.meta_graphs[0]
    cut = {info.name.split(":")[0] for info in graph.signature_def["serving_default"].outputs.values()}
    kept = [node for node in graph.graph_def.node if node.name not in cut]
    del graph.graph_def.node[:]
    graph.graph_def.node.extend(kept)
    (dst / "saved_model.pb").write_bytes(saved.SerializeToString())


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    root = tmp_path_factory.mktemp("keras_models")
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    cases = {**save_keras(root, x), **save_plain_modules(root, x)}
    for name, source in FALLBACK_MODELS.items():
        cut_signature_call(root / source / "1", root / name / "1")
        cases[name] = cases[source]
    import keras

    keras.backend.clear_session()  # Keras' name counters are global: leave "keras_tensor" to later tests
    return Built(root, cases)


@pytest.fixture(scope="module")
def server(built):
    with ServerProcess([str(built.root)]) as proc:
        yield proc


def assert_outputs(got: dict[str, np.ndarray], case: Case) -> None:
    assert sorted(got) == sorted(case.expected)
    for key, want in case.expected.items():
        value = np.asarray(got[key])
        assert value.dtype == want.dtype, key
        assert np.allclose(value, want, rtol=1e-5, atol=1e-5), (key, value, want)


# -- runtime ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SESSION_MODELS)
def test_runtime_runs_in_a_session(built, name):
    case = built.cases[name]
    with load_saved_model(built.path(name)) as model:
        assert (model.backend, model.fallback_reason) == ("session", None)
        (key,) = model.signatures["serving_default"].inputs
        assert_outputs(model.run("serving_default", {key: case.x}), case)


def test_keras_variables_are_missing_from_the_restore_op(built):
    """The cause, as TF Serving's loader sees it: the saver_def restores copies, not what serve reads."""
    import tensorflow as tf

    from tfservo.models.captured_variables import restore_captured_variables

    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        with graph.as_default():
            meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], built.path("keras_module"))
        restored = restore_captured_variables(session, meta, built.path("keras_module"), ["serving_default"])
    assert any(name.endswith("batch_normalization/moving_mean") for name in restored), restored
    assert len(restored) == 8  # both Dense layers' kernel and bias, and all four BatchNormalization variables


@pytest.mark.parametrize("name", FALLBACK_MODELS)
def test_runtime_falls_back_at_load_time(built, name):
    case = built.cases[name]
    with load_saved_model(built.path(name)) as model:
        assert model.backend == "function"
        reason = (
            r"signature 'serving_default' names tensor 'StatefulPartitionedCall:\d', which its graph lacks"
        )
        assert re.fullmatch(reason, model.fallback_reason), model.fallback_reason
        assert_outputs(model.run("serving_default", {"x": case.x}), case)  # same outputs, same dtypes


def test_unloadable_either_way_fails_at_load(built, tmp_path):
    broken = tmp_path / "broken"
    cut_signature_call(built.root / "keras_module" / "1", broken)
    shutil.rmtree(broken / "variables")
    message = f"Failed to load SavedModel at {broken}: as a graph: .*; as TF2 functions: "
    with pytest.raises(ModelLoadError, match=message):
        load_saved_model(str(broken))


def test_variables_nothing_restores_fail_at_load(built, tmp_path):
    """No saver_def and no variables/: refused at load, naming the variables, not AVAILABLE and failing."""
    broken = tmp_path / "no_variables"
    shutil.copytree(built.root / "plain_skip_saver" / "1", broken)
    shutil.rmtree(broken / "variables")
    with pytest.raises(ModelLoadError) as exc:
        load_saved_model(str(broken))
    message = exc.value.message
    assert message.startswith(f"Failed to load SavedModel at {broken}: as a graph: variables Variable")
    assert f"are not restored by the saver_def and the checkpoint at {broken / 'variables'}" in message
    assert "; as TF2 functions: " in message and "\n" not in message


# -- a real server -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*SESSION_MODELS, *FALLBACK_MODELS])
def test_serve_predicts_like_tensorflow(built, server, name):
    case = built.cases[name]
    with server.client() as client:
        r = client.post(f"/v1/models/{name}:predict", content=json.dumps({"inputs": case.x.tolist()}))
    assert r.status_code == 200, r.text
    outputs = r.json()["outputs"]
    if not isinstance(outputs, dict):  # a single output comes back bare
        (key,) = case.expected
        outputs = {key: outputs}
    got = {k: np.asarray(v, dtype=case.expected[k].dtype) for k, v in outputs.items()}
    assert_outputs(got, case)
    if "n" in outputs:  # int64 comes back as JSON integers
        assert all(isinstance(v, int) for v in outputs["n"]), outputs["n"]


def test_serve_logs_each_fallback_once(server):
    lines = sorted(line for line in server.lines if "runs through tf.saved_model.load" in line)
    assert len(lines) == 2, server.output
    for line, name in zip(lines, sorted(FALLBACK_MODELS)):
        assert f"model {name} version 1 runs through" in line and "which its graph lacks" in line
    # Restoring the variables Keras 3 exports leave out of their saver is routine: DEBUG only.
    assert not [line for line in server.lines if "variable(s) its signatures read" in line], server.output
