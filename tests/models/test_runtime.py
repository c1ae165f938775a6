"""tfservo.models: loading TF1 and TF2 SavedModels, signatures, running them, and errors."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, TFS

from tfservo.core.errors import Code, FailedPrecondition, InvalidArgument, ModelLoadError
from tfservo.models import CLASSIFY_METHOD, PREDICT_METHOD, REGRESS_METHOD, load_saved_model, savedmodel

HALF_PLUS_TWO_SIGNATURES = [
    "classify_x_to_y",
    "regress_x2_to_y3",
    "regress_x_to_y",
    "regress_x_to_y2",
    "serving_default",
]


def example(**features: float) -> bytes:
    import tensorflow as tf

    feature = {k: tf.train.Feature(float_list=tf.train.FloatList(value=[v])) for k, v in features.items()}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def examples(*rows: dict[str, float]) -> np.ndarray:
    out = np.empty(len(rows), dtype=object)
    out[:] = [example(**row) for row in rows]
    return out


@pytest.fixture(scope="module")
def half_plus_two():
    model = load_saved_model(str(TFS / "saved_model_half_plus_two_cpu" / "00000123"))
    yield model
    model.close()


@pytest.fixture(scope="module")
def half_plus_two_v124():
    model = load_saved_model(str(TFS / "saved_model_half_plus_two_2_versions" / "00000124"))
    yield model
    model.close()


@pytest.fixture(scope="module")
def half_plus_three():
    model = load_saved_model(str(TFS / "saved_model_half_plus_three" / "00000123"))
    yield model
    model.close()


@pytest.fixture(scope="module")
def tf2_half_plus_two():
    model = load_saved_model(str(TFS / "saved_model_half_plus_two_tf2_cpu" / "00000123"))
    yield model
    model.close()


@pytest.fixture(scope="module")
def keras_mlp(tmp_path_factory):
    """A Keras 3 MLP exported with model.export, plus an input batch and Keras' own prediction."""
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    path = tmp_path_factory.mktemp("keras") / "mlp"
    model.export(str(path), verbose=False)
    x = np.random.default_rng(0).random((3, 784), dtype=np.float32)
    return str(path), x, np.asarray(model.predict(x, verbose=0))


@pytest.fixture(scope="module")
def toolbox(tmp_path_factory) -> str:
    """A tf.saved_model.save model with string, int and defaulted inputs."""
    import tensorflow as tf

    class Toolbox(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def shout(self, words):
            return {"upper": tf.strings.upper(words), "length": tf.strings.length(words)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
        def double(self, n):
            return {"twice": n * 2}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.float32)])
        def scale(self, x, factor=tf.constant(2.0)):
            return {"y": x * factor}

    module = Toolbox()
    path = tmp_path_factory.mktemp("toolbox") / "1"
    tf.saved_model.save(
        module, str(path), signatures={"shout": module.shout, "double": module.double, "scale": module.scale}
    )
    return str(path)


# -- loading and signatures ------------------------------------------------------------------


def test_tf1_signatures(half_plus_two, half_plus_two_v124):
    assert half_plus_two.backend == "session"
    assert sorted(half_plus_two.signatures) == HALF_PLUS_TWO_SIGNATURES
    assert sorted(half_plus_two_v124.signatures) == sorted(HALF_PLUS_TWO_SIGNATURES + ["classify_x2_to_y3"])
    sigs = half_plus_two.signatures
    assert sigs["serving_default"].method_name == PREDICT_METHOD
    assert sigs["classify_x_to_y"].method_name == CLASSIFY_METHOD
    assert sigs["regress_x2_to_y3"].method_name == REGRESS_METHOD
    x = sigs["serving_default"].inputs["x"]
    assert (x.tensor_name, x.dtype, x.shape) == ("x:0", "DT_FLOAT", (-1, 1))
    assert sigs["serving_default"].outputs["y"].shape == (-1, 1)
    examples_in = sigs["classify_x_to_y"].inputs["inputs"]
    assert (examples_in.dtype, examples_in.shape) == ("DT_STRING", None)
    assert half_plus_two.meta_graph_def.meta_info_def.tags == ["serve"]


def test_half_plus_three_signatures(half_plus_three):
    sigs = half_plus_three.signatures
    assert sorted(sigs) == ["serving_default", "tensorflow/serving/regress"]
    assert sigs["tensorflow/serving/regress"].method_name == REGRESS_METHOD
    # x's TensorInfo records no shape at all: unknown, not a scalar.
    assert sigs["serving_default"].inputs["x"].shape is None


def test_tf2_signatures(tf2_half_plus_two):
    sigs = tf2_half_plus_two.signatures
    assert tf2_half_plus_two.backend == "session"
    assert sorted(sigs) == sorted(HALF_PLUS_TWO_SIGNATURES + ["classify_x2_to_y3"])
    assert "__saved_model_init_op" in tf2_half_plus_two.meta_graph_def.signature_def  # kept for metadata
    assert all(sig.method_name == PREDICT_METHOD for sig in sigs.values())
    x = sigs["serving_default"].inputs["x"]
    assert (x.tensor_name, x.dtype, x.shape) == ("serving_default_x:0", "DT_FLOAT", (1,))
    assert sigs["classify_x_to_y"].inputs["inputs"].shape == (-1,)


# -- running ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["half_plus_two", "half_plus_two_v124"])
def test_predict(request, fixture):
    model = request.getfixturevalue(fixture)
    out = model.run("serving_default", {"x": np.array([[1.0], [2.0]], np.float32)})
    assert list(out) == ["y"]
    np.testing.assert_allclose(out["y"], [[2.5], [3.0]])
    assert out["y"].dtype == np.float32


def test_predict_half_plus_three_and_tf2(half_plus_three, tf2_half_plus_two):
    out = half_plus_three.run("serving_default", {"x": [[1.0], [2.0]]})
    np.testing.assert_allclose(out["y"], [[3.5], [4.0]])
    out = tf2_half_plus_two.run("serving_default", {"x": [1.0, 2.0, 5.0]})
    np.testing.assert_allclose(out["y"], [2.5, 3.0, 4.5])


def test_shapes_are_not_enforced_by_default(half_plus_two):
    # TF Serving feeds whatever it gets; half_plus_two's famous `[1.0, 2.0, 5.0]` request is rank 1.
    out = half_plus_two.run("serving_default", {"x": [1.0, 2.0, 5.0]})
    np.testing.assert_allclose(out["y"], [2.5, 3.0, 4.5])


def test_python_ints_become_floats(half_plus_two):
    np.testing.assert_allclose(half_plus_two.run("serving_default", {"x": [[1], [2]]})["y"], [[2.5], [3.0]])


def test_regress_x2_to_y3_with_float_tensor(half_plus_two, tf2_half_plus_two):
    out = half_plus_two.run("regress_x2_to_y3", {"inputs": np.array([[1.0], [2.0]], np.float32)})
    np.testing.assert_allclose(out["outputs"], [[3.5], [4.0]])
    np.testing.assert_allclose(tf2_half_plus_two.run("regress_x2_to_y3", {"inputs": [4.0]})["outputs"], [5.0])


@pytest.mark.parametrize("fixture", ["half_plus_two", "tf2_half_plus_two"])
def test_classify_and_regress_examples(request, fixture):
    model = request.getfixturevalue(fixture)
    batch = examples({"x": 1.0, "x2": 4.0}, {"x": 3.0})
    np.testing.assert_allclose(model.run("classify_x_to_y", {"inputs": batch})["scores"], [[2.5], [3.5]])
    np.testing.assert_allclose(model.run("regress_x_to_y", {"inputs": batch})["outputs"], [[2.5], [3.5]])
    np.testing.assert_allclose(model.run("regress_x_to_y2", {"inputs": batch})["outputs"], [[3.5], [4.5]])


def test_half_plus_three_regress_examples(half_plus_three):
    # The signature claims DT_FLOAT for its serialized-Example input; the graph's dtype wins.
    out = half_plus_three.run("tensorflow/serving/regress", {"inputs": examples({"x": 1.0}, {"x": 3.0})})
    np.testing.assert_allclose(out["outputs"], [[3.5], [4.5]])


def test_example_feature_types(half_plus_two, half_plus_three, tf2_half_plus_two, keras_mlp):
    assert half_plus_two.example_feature_types() == {"x": "float", "x2": "float"}
    assert tf2_half_plus_two.example_feature_types() == {"x": "float", "x2": "float"}
    assert half_plus_three.example_feature_types() == {"x": "float"}
    with load_saved_model(keras_mlp[0]) as model:
        assert model.example_feature_types() == {}


def test_counter_is_stateful():
    with load_saved_model(str(TFS / "saved_model_counter" / "00000123")) as counter:
        names = ["get_counter", "incr_counter", "incr_counter_by", "reset_counter"]
        assert sorted(counter.signatures) == names
        assert counter.signatures["get_counter"].outputs["output"].dtype == "DT_FLOAT_REF"
        counter.run("reset_counter", {})
        assert counter.run("incr_counter", {})["output"] == 1.0
        assert counter.run("incr_counter", {})["output"] == 2.0
        assert counter.run("incr_counter_by", {"delta": 3})["output"] == 5.0
        out = counter.run("get_counter", {})["output"]
        assert isinstance(out, np.ndarray) and out.shape == () and out == 5.0


def test_output_keys_subset(half_plus_two):
    assert list(half_plus_two.run("serving_default", {"x": [[1.0]]}, output_keys=["y"])) == ["y"]
    with pytest.raises(InvalidArgument, match="'z' not found in signature 'serving_default'.*outputs are: y"):
        half_plus_two.run("serving_default", {"x": [[1.0]]}, output_keys=["z"])


def test_strings_ints_and_defaults(toolbox):
    with load_saved_model(toolbox) as model:
        assert model.signatures["shout"].inputs["words"].dtype == "DT_STRING"
        out = model.run("shout", {"words": np.array(["héllo", b"ab"], dtype=object)})
        assert out["upper"].dtype == object and out["upper"].tolist() == ["HéLLO".encode(), b"AB"]
        assert out["length"].tolist() == [6, 2]
        assert model.run("shout", {"words": ["x"]})["upper"].tolist() == [b"X"]  # numpy str array
        assert model.run("double", {"n": [1, 2]})["twice"].tolist() == [2, 4]
        assert model.run("double", {"n": [3.0]})["twice"].tolist() == [6]  # integral float is safe
        with pytest.raises(InvalidArgument, match="Input 'n' of signature 'double' expects DT_INT64"):
            model.run("double", {"n": [1.5]})
        with pytest.raises(InvalidArgument, match="Input 'words' .* expects DT_STRING.*send strings"):
            model.run("shout", {"words": [1.0]})
        np.testing.assert_allclose(model.run("scale", {"x": [1.0, 2.0]})["y"], [2.0, 4.0])  # default factor
        np.testing.assert_allclose(model.run("scale", {"x": [1.0], "factor": 3})["y"], [3.0])


def test_keras3_export_matches_keras(keras_mlp):
    path, x, expected = keras_mlp
    with load_saved_model(path) as model:
        assert model.backend == "session"
        sig = model.signatures["serving_default"]
        (key,) = sig.inputs
        assert sig.inputs[key].shape == (-1, 784) and sig.outputs["output_0"].shape == (-1, 10)
        out = model.run("serving_default", {key: x})["output_0"]
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_function_fallback_runs_tf2_models(keras_mlp):
    path, x, expected = keras_mlp
    model = savedmodel._load_with_functions(path)
    assert model.backend == "function"
    out = model.run("serving_default", {"keras_tensor": x})["output_0"]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    model.close()
    tf2 = savedmodel._load_with_functions(str(TFS / "saved_model_half_plus_two_tf2_cpu" / "00000123"))
    out = tf2.run("regress_x_to_y2", {"inputs": examples({"x": 1.0})})
    np.testing.assert_allclose(out["outputs"], [[3.5]])
    tf2.close()


def test_concurrent_runs(half_plus_two):
    results: list[np.ndarray] = []

    def work(i: int) -> None:
        for _ in range(20):
            results.append(half_plus_two.run("serving_default", {"x": [[float(i)]]})["y"][0, 0] - 0.5 * i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 160 and set(results) == {2.0}


# -- errors ----------------------------------------------------------------------------------


def test_unknown_signature(half_plus_two):
    message = "Serving signature name: 'nope' not found.*serving_default"
    with pytest.raises(InvalidArgument, match=message) as exc:
        half_plus_two.run("nope", {"x": [[1.0]]})
    assert exc.value.code == Code.INVALID_ARGUMENT


def test_wrong_and_missing_input_keys(half_plus_two):
    with pytest.raises(InvalidArgument, match="missing x; unexpected z. Expected inputs: x"):
        half_plus_two.run("serving_default", {"z": [[1.0]]})
    with pytest.raises(InvalidArgument, match="unexpected extra. Expected inputs: x"):
        half_plus_two.run("serving_default", {"x": [[1.0]], "extra": [[1.0]]})


def test_arrays_of_the_inputs_dtype_keep_every_check(half_plus_two):
    # Arrays already of the signature's dtypes are fed without conversion, not without checks.
    x = np.array([[1.0], [2.0]], np.float32)
    np.testing.assert_allclose(half_plus_two.run("serving_default", {"x": x})["y"], [[2.5], [3.0]])
    np.testing.assert_allclose(half_plus_two.run("serving_default", {"x": x.astype(np.float64)})["y"], [[2.5], [3.0]])
    with pytest.raises(InvalidArgument, match="missing x; unexpected z. Expected inputs: x"):
        half_plus_two.run("serving_default", {"z": x})
    with load_saved_model(str(TFS / "saved_model_half_plus_two_cpu" / "00000123"), strict_shapes=True) as strict:
        with pytest.raises(InvalidArgument, match=r"has shape \[1, 2\].*expects \[-1, 1\]"):
            strict.run("serving_default", {"x": np.ones((1, 2), np.float32)})


def test_string_into_float(half_plus_two):
    message = "Input 'x' of signature 'serving_default' expects DT_FLOAT.*strings"
    with pytest.raises(InvalidArgument, match=message):
        half_plus_two.run("serving_default", {"x": [["a"]]})
    with pytest.raises(InvalidArgument, match="Input 'x'.*same length"):
        half_plus_two.run("serving_default", {"x": [[1.0, 2.0], [3.0]]})


def test_wrong_shape_strict():
    model = load_saved_model(str(TFS / "saved_model_half_plus_two_cpu" / "00000123"), strict_shapes=True)
    message = r"input 'x' of signature 'serving_default' has shape \[3\].*expects \[-1, 1\]"
    with pytest.raises(InvalidArgument, match=message):
        model.run("serving_default", {"x": [1.0, 2.0, 5.0]})
    with pytest.raises(InvalidArgument, match=r"has shape \[1, 2\].*expects \[-1, 1\]"):
        model.run("serving_default", {"x": [[1.0, 2.0]]})
    np.testing.assert_allclose(model.run("serving_default", {"x": [[1.0]]})["y"], [[2.5]])
    model.close()


def test_wrong_shape_rejected_by_tensorflow(keras_mlp):
    path, _, _ = keras_mlp
    with load_saved_model(path) as model:
        with pytest.raises(InvalidArgument) as exc:
            model.run("serving_default", {"keras_tensor": np.ones((1, 10), np.float32)})
    message = exc.value.message
    assert "\n" not in message
    assert "while running signature 'serving_default'" in message
    assert "input 'keras_tensor' of signature 'serving_default' has shape [1, 10]" in message


def test_tensorflow_error_is_one_line(half_plus_two):
    junk = np.array([b"not an example"], dtype=object)
    with pytest.raises(InvalidArgument, match="while running signature 'classify_x_to_y'") as exc:
        half_plus_two.run("classify_x_to_y", {"inputs": junk})
    assert "\n" not in exc.value.message and "Traceback" not in exc.value.message


def test_bad_model_fails_to_load():
    path = TFS / "bad_half_plus_two" / "00000123"
    with pytest.raises(ModelLoadError, match="SessionBundle") as exc:
        load_saved_model(str(path))
    assert str(path) in exc.value.message and exc.value.code == Code.FAILED_PRECONDITION


def test_missing_dir_and_wrong_tags(tmp_path):
    with pytest.raises(ModelLoadError, match=f"{tmp_path / 'nope'} does not exist"):
        load_saved_model(str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match=f"No saved_model.pb in {tmp_path}"):
        load_saved_model(str(tmp_path))
    message = r"no MetaGraph with tags \['gpu'\]; available tag sets: \[\['serve'\]\]"
    with pytest.raises(ModelLoadError, match=message):
        load_saved_model(str(TFS / "saved_model_half_plus_two_cpu" / "00000123"), tags=["gpu"])


def test_broken_files_fail_to_load(tmp_path):
    import shutil

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "saved_model.pb").write_bytes(b"\x00garbage")
    with pytest.raises(ModelLoadError, match=str(corrupt)) as exc:
        load_saved_model(str(corrupt))
    assert "\n" not in exc.value.message

    no_vars = tmp_path / "no_vars"
    shutil.copytree(TFS / "saved_model_half_plus_two_cpu" / "00000123", no_vars)
    shutil.rmtree(no_vars / "variables")
    with pytest.raises(ModelLoadError, match=f"Failed to load SavedModel at {no_vars}"):
        load_saved_model(str(no_vars))


def test_run_after_close():
    model = load_saved_model(str(TFS / "saved_model_half_plus_two_cpu" / "00000123"))
    model.close()
    model.close()  # idempotent
    with pytest.raises(FailedPrecondition, match="unloaded"):
        model.run("serving_default", {"x": [[1.0]]})


def test_import_is_light_and_quiet():
    code = (
        "import os, sys, tfservo.models as r; "
        "assert 'tensorflow' not in sys.modules; "
        "print(os.environ['TF_CPP_MIN_LOG_LEVEL'], r.QUIET_TENSORFLOW)"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}

    def run() -> list[str]:
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert run() == ["2", "True"]
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    assert run() == ["0", "False"]


def test_paths_may_be_pathlike():
    path = Path(TFS / "saved_model_half_plus_three" / "00000123")
    with load_saved_model(path) as model:  # type: ignore[arg-type]
        assert model.path.endswith("00000123")
