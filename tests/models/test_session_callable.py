"""tfservo's one use of a private TensorFlow API (tfservo.models.session_callable): it exists in
the TensorFlow the lock pins, which is the version it was tested with, and answers as the
public path does."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from tfservo.models.session_callable import TESTED_TF, make_session_callable, public_session_callable


def test_the_private_session_callable_is_there_and_answers_as_the_public_one() -> None:
    assert tf.__version__.startswith(TESTED_TF), f"TensorFlow {tf.__version__}: test the private path, then add it to TESTED_TF"
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        tf.identity(0.5 * x + 2.0, name="y")
    with tf.compat.v1.Session(graph=graph) as session:
        assert hasattr(session, "_make_callable_from_options")
        options = config_pb2.CallableOptions(feed=["x:0"], fetch=["y:0"])
        values = np.array([1.0, 2.0, 5.0], np.float32)
        (fast,) = make_session_callable(session, options)(values)
        (public,) = public_session_callable(session, options)(values)
    np.testing.assert_array_equal(fast, [2.5, 3.0, 4.5])
    np.testing.assert_array_equal(public, fast)
