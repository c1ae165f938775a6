"""Models the Beam tests build with TensorFlow, and a bundle with a code/inference.py.

Import the fixture into a test module with `from beam_models import beam_models  # noqa: F401`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from conftest import write_code

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "beam_tfx_patterns.py"

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


@functools.cache
def tfx_example() -> ModuleType:
    """examples/beam_tfx_patterns.py as a module: its builders make the ×5 / ×10 models here too."""
    spec = importlib.util.spec_from_file_location("beam_tfx_patterns", EXAMPLE)
    assert spec is not None and spec.loader is not None, EXAMPLE
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    build_multiply = tfx_example().build_multiply_model
    five = build_multiply(str(root), "multiply_five", 5.0)
    ten = build_multiply(str(root), "multiply_ten", 10.0)
    two = build_two_inputs(root)
    handled = root / "with_handler"
    build_multiply(str(handled), "multiply_five", 5.0)
    write_code(handled / "code", INFERENCE_PY)
    return BeamModels(five, ten, two, str(handled))


__all__ = ["BeamModels", "beam_models", "tfx_example"]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
