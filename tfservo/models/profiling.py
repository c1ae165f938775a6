"""Annotations in TensorFlow's profiler traces (its TraceMe events): each model run and each poll
of the model base paths shows in a trace captured over the gRPC port (tfservo.grpc.profiler).

An annotation costs about half a microsecond when no trace is being captured.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

__all__ = ["annotation"]


def annotation(name: str, **labels: object) -> AbstractContextManager[object]:
    """A TraceMe span called `name` with `labels`, recorded only while a profile is captured."""
    global _trace
    if _trace is None:
        import tensorflow as tf  # already loaded wherever models run

        _trace = tf.profiler.experimental.Trace  # looked up once: TF's API modules resolve names lazily
    trace: AbstractContextManager[object] = _trace(name, **labels)
    return trace


_trace: Callable[..., AbstractContextManager[object]] | None = None
