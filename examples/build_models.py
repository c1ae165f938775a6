"""Build the example bundle from code (fixed weights, no downloads).

`half_plus_ten`: y = 0.5·x + 10, with a predict signature (x → y) and a regress signature
that reads tf.Examples with a float feature `x`, like TF Serving's half_plus_two test model.
"""

from __future__ import annotations

import os
import sys

from tfservo.core.logs import quiet_tensorflow

quiet_tensorflow()

import tensorflow as tf  # noqa: E402


class HalfPlusTen(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = tf.Variable(0.5)
        self.b = tf.Variable(10.0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def predict(self, x):
        return {"y": self.a * x + self.b}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def regress(self, serialized):
        feats = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([], tf.float32, default_value=0.0)})
        return {"outputs": self.a * feats["x"] + self.b}


def build_half_plus_ten(path: str) -> str:
    """Save half_plus_ten version 1 under `path`/half_plus_ten/00000001."""
    module = HalfPlusTen()
    export = os.path.join(path, "half_plus_ten", "00000001")
    tf.saved_model.save(
        module,
        export,
        signatures={
            "serving_default": module.predict.get_concrete_function(),
            "regress_x_to_y": module.regress.get_concrete_function(),
        },
    )
    _set_method(export, "regress_x_to_y", "tensorflow/serving/regress")
    return export


def _set_method(export: str, signature: str, method: str) -> None:
    """tf.saved_model.save writes every signature as predict; TF Serving reads method_name."""
    from tensorflow.core.protobuf import saved_model_pb2

    pb = os.path.join(export, "saved_model.pb")
    sm = saved_model_pb2.SavedModel()
    with open(pb, "rb") as f:
        sm.ParseFromString(f.read())
    for mg in sm.meta_graphs:
        mg.signature_def[signature].method_name = method
    with open(pb, "wb") as f:
        f.write(sm.SerializeToString())


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "examples/models"
    print("built", build_half_plus_ten(out))
