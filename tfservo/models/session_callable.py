"""The one use of a private TensorFlow API: `Session._make_callable_from_options`, TF's C++
MakeCallable. The public `Session.make_callable` with a feed list takes the slow `Session.run`
path; the private one is what keeps a small model's call at tens of µs.

Tested with TESTED_TF (the version requirements-dev.lock pins; tests/models/test_session_callable.py
runs it). Another TensorFlow still uses it, with one warning; a TensorFlow without it gets the
public path, slower but the same answers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

__all__ = ["TESTED_TF", "make_session_callable"]

log = logging.getLogger("tfservo.models")

TESTED_TF = ("2.21.",)
_warned: set[str] = set()


def make_session_callable(session: tf.compat.v1.Session, options: config_pb2.CallableOptions) -> Callable[..., Any]:
    """A callable taking one array per `options.feed` and returning the `options.fetch` values."""
    private = getattr(session, "_make_callable_from_options", None)
    if private is None:
        _warn_once("has no Session._make_callable_from_options: model calls take the slower public path")
        return public_session_callable(session, options)
    if not tf.__version__.startswith(TESTED_TF):
        _warn_once(f"is not the version tfservo's session callables were tested with ({', '.join(TESTED_TF)}x)")
    made: Callable[..., Any] = private(options)
    return made


def public_session_callable(session: tf.compat.v1.Session, options: config_pb2.CallableOptions) -> Callable[..., Any]:
    """The same callable through the public API (Session.make_callable with a feed list)."""
    graph = session.graph
    feeds = [graph.get_tensor_by_name(name) for name in options.feed]
    fetches = [graph.get_tensor_by_name(name) for name in options.fetch]
    made: Callable[..., Any] = session.make_callable(fetches, feed_list=feeds)
    return made


def _warn_once(problem: str) -> None:
    if tf.__version__ not in _warned:
        _warned.add(tf.__version__)
        log.warning("TensorFlow %s %s", tf.__version__, problem)
