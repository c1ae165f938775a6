"""Keras 3 models built from code and saved as `.keras` files in version dirs, as their users
save them (`model.save("model.keras")`), with what Keras itself answers for sample inputs.

- mlp: Sequential, input "x" float32 [-1, 4], one output.
- pair: functional, inputs "age" [-1, 3] and "income" [-1, 2], dict outputs "klass" and "score".
- words: a StringLookup with a vocabulary (kept in the file's assets), string input "word".
- doubled: a Lambda layer ("double"), which safe loading refuses.
- scaled: a registered custom layer ("scale", mine>Scale); its bundle's code/inference.py
  registers the class, `scaled_bare` is the same file with no code beside it.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SCALE_CODE = '''import keras


@keras.saving.register_keras_serializable(package="mine")
class Scale(keras.layers.Layer):
    def call(self, x):
        return x * 3.0


def input_handler(data, context):
    return data.read()


def output_handler(response, context):
    return response.content, context.accept_header
'''


@dataclass
class KerasModels:
    root: Path  # <root>/<name>/1/model.keras for each model
    mlp_x: np.ndarray
    mlp_y: np.ndarray
    pair_in: dict[str, np.ndarray]
    pair_out: dict[str, np.ndarray]
    words_in: list[str]
    words_out: np.ndarray

    def dir(self, name: str) -> Path:
        return self.root / name

    def mlp_csv_input(self, source: Path) -> dict[str, str]:
        """mlp's sample rows as source/rows.csv, and the transform flags that read them a line a record."""
        source.mkdir(parents=True, exist_ok=True)
        (source / "rows.csv").write_text("".join(",".join(str(v) for v in row) + "\n" for row in self.mlp_x.tolist()))
        return {"content_type": "text/csv", "split_type": "Line", "assemble_with": "Line"}


def build_keras_models(root: Path) -> KerasModels:
    """Every model above under `root`, and Keras's own answers for the sample inputs."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(7)

    def save(model: keras.Model, name: str) -> None:
        version = root / name / "1"
        version.mkdir(parents=True)
        model.save(version / "model.keras")

    mlp = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(8, activation="relu"),
                            keras.layers.Dense(2)])
    save(mlp, "mlp")
    mlp_x = np.array([[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0]], np.float32)

    age, income = keras.Input((3,), name="age"), keras.Input((2,), name="income")
    hidden = keras.layers.Dense(4, activation="tanh")(keras.layers.Concatenate()([age, income]))
    pair = keras.Model({"age": age, "income": income},
                       {"klass": keras.layers.Dense(3, activation="softmax", name="klass")(hidden),
                        "score": keras.layers.Dense(1, name="score")(hidden)})
    save(pair, "pair")
    pair_in = {"age": np.array([[30.0, 1.0, 0.0]], np.float32), "income": np.array([[4.5, 0.5]], np.float32)}

    word = keras.Input((1,), dtype="string", name="word")
    words = keras.Model(word, keras.layers.StringLookup(vocabulary=["red", "green", "blue"], name="lookup")(word))
    save(words, "words")
    words_in = ["green", "blue", "purple"]

    x = keras.Input((3,), name="x")
    save(keras.Model(x, keras.layers.Lambda(lambda t: t * 2.0, name="double")(x)), "doubled")

    @keras.saving.register_keras_serializable(package="mine")
    class Scale(keras.layers.Layer):
        def call(self, x):
            return x * 3.0

    x = keras.Input((3,), name="x")
    save(keras.Model(x, Scale(name="scale")(x)), "scaled")
    shutil.copytree(root / "scaled", root / "scaled_bare")
    (root / "scaled" / "code").mkdir()
    (root / "scaled" / "code" / "inference.py").write_text(SCALE_CODE)

    return KerasModels(
        root=root, mlp_x=mlp_x, mlp_y=np.asarray(mlp.predict(mlp_x, verbose=0)),
        pair_in=pair_in, pair_out={k: np.asarray(v) for k, v in pair.predict(pair_in, verbose=0).items()},
        words_in=words_in, words_out=np.asarray(words(tf.constant([[w] for w in words_in]))),
    )


def rewrite_config(source: Path, target: Path, change) -> None:
    """Copy the .keras file `source` to `target` with its config.json passed through `change`
    (what an attacker who edits a model file can do)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for item in old.infolist():
            data = old.read(item)
            if item.filename == "config.json":
                data = json.dumps(change(json.loads(data))).encode()
            new.writestr(item, data)
