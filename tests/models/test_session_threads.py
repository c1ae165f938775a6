"""Where a model's ops run: by default in the thread that called the model (no hand-off to
TensorFlow's inter-op pool and back); SAGEMAKER_TFS_INTER_OP_PARALLELISM (and
--inter-op-threads) still choose TF's pool."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tfservo.core.settings import resolve_settings
from tfservo.service.factory import build_service


def _thread_of(values: np.ndarray) -> np.ndarray:
    """The op's answer: the id of the thread it ran in, once per row."""
    return np.full(values.shape, threading.get_ident(), np.int64)


@pytest.fixture(scope="module")
def thread_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SavedModel whose one output is the thread its op ran in (a numpy_function, so it
    loads in this process only: the function is this module's)."""
    root = tmp_path_factory.mktemp("threads") / "which_thread"
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        thread = tf.numpy_function(_thread_of, [x], tf.int64)
        with tf.compat.v1.Session(graph=graph) as session:
            builder = tf.compat.v1.saved_model.Builder(str(root / "1"))
            signature = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"thread": thread})
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={"serving_default": signature})
            builder.save()
    return root


def _ran_in(model: Path, env: dict[str, str]) -> int:
    service = build_service(resolve_settings(paths=[str(model)], multi_model=False, serving=False, env=env))
    try:
        with service.api.manager.acquire("which_thread") as version:
            answer = version.run("serving_default", {"x": np.zeros(2, np.float32)})
        return int(answer["thread"][0])
    finally:
        service.close()


def test_ops_run_in_the_calling_thread_by_default(thread_model: Path) -> None:
    assert _ran_in(thread_model, {}) == threading.get_ident()


def test_the_inter_op_setting_still_chooses_tensorflows_pool(thread_model: Path) -> None:
    assert _ran_in(thread_model, {"SAGEMAKER_TFS_INTER_OP_PARALLELISM": "2"}) != threading.get_ident()
    assert _ran_in(thread_model, {"SAGEMAKER_TFS_INTER_OP_PARALLELISM": "0"}) != threading.get_ident()
