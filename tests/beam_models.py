"""Models the Beam tests build with TensorFlow, and a bundle with a code/inference.py.

Import the fixture into a test module with `from beam_models import beam_models  # noqa: F401`.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

# The handler posts to context.rest_uri: the loopback server must be live for this to answer.
INFERENCE_PY = """
import json
import requests

def handler(data, context):
    rows = [float(line) for line in data.read().decode().split()]
    response = requests.post(context.rest_uri, data=json.dumps({"instances": rows}), timeout=30)
    if response.status_code != 200:
        raise ValueError(response.text)
    values = response.json()["predictions"]
    return "\\n".join(f"{x:g}->{y:g}" for x, y in zip(rows, values)), "text/plain"
"""


@dataclass(frozen=True)
class BeamModels:
    five: str  # bundle dir: multiply_five/00000001, y = 5·x, input x float32[None]
    ten: str  # bundle dir: multiply_ten/00000001, y = 10·x
    two_inputs: str  # bundle dir: two_inputs/00000001, inputs a, b float32[None, 2] → product, total
    with_handler: str  # multiply_five plus code/inference.py (handler via context.rest_uri)


def build_multiply(root: Path, name: str, factor: float) -> str:
    import tensorflow as tf

    class Multiply(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.factor = tf.Variable(factor)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            return {"y": x * self.factor}

    module = Multiply()
    bundle = root / name
    tf.saved_model.save(module, str(bundle / "00000001"), signatures={"serving_default": module.serve})
    return str(bundle)


def build_two_inputs(root: Path) -> str:
    import tensorflow as tf

    class TwoInputs(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 2], tf.float32, name="a"),
                tf.TensorSpec([None, 2], tf.float32, name="b"),
            ]
        )
        def serve(self, a, b):
            return {"product": a * b, "total": tf.reduce_sum(a + b, axis=1)}

    module = TwoInputs()
    bundle = root / "two_inputs"
    tf.saved_model.save(module, str(bundle / "00000001"), signatures={"serving_default": module.serve})
    return str(bundle)


@pytest.fixture(scope="session")
def beam_models(tmp_path_factory: pytest.TempPathFactory) -> BeamModels:
    root = tmp_path_factory.mktemp("beam-models")
    five = build_multiply(root, "multiply_five", 5.0)
    ten = build_multiply(root, "multiply_ten", 10.0)
    two = build_two_inputs(root)
    handled = root / "with_handler"
    build_multiply(handled, "multiply_five", 5.0)
    code = handled / "code"
    code.mkdir()
    (code / "inference.py").write_text(textwrap.dedent(INFERENCE_PY))
    return BeamModels(five, ten, two, str(handled))


__all__ = ["BeamModels", "beam_models", "build_multiply"]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
