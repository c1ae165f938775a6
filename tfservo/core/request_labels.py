"""What a request turned out to be about (model, served version, status), for metrics and logs.

The protocol layer opens a scope per request; the model manager notes the model and the
version it resolved, wherever in the call that happens (also in worker threads, which run
in a copy of the request's context that shares this object). Only names of served models
are ever noted, so label values stay bounded whatever clients send.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from dataclasses import dataclass

__all__ = [
    "current",
    "note_method",
    "note_model",
    "note_version",
    "plain_scope",
    "RequestLabels",
    "RequestScope",
    "reset_current",
    "set_current",
    "tracking",
]


@dataclass(slots=True)
class RequestLabels:
    """Labels of one request; empty strings until known. The last four are for the access log
    only (never metric labels: they are unbounded)."""

    route: str = ""
    method: str = ""
    model: str = ""
    version: str = ""
    status: str = ""
    verb: str = ""  # the HTTP method, or "" for gRPC
    path: str = ""  # the HTTP path, or the gRPC method
    bytes_out: int = 0  # the answer's body
    inference_id: str = ""  # X-Amzn-SageMaker-Inference-Id


_current: ContextVar[RequestLabels | None] = ContextVar("tfservo_request_labels", default=None)

# (route, method) → a scope that makes the request's labels current and records it on exit.
RequestScope = Callable[[str, str], AbstractContextManager[RequestLabels]]


def set_current(labels: RequestLabels) -> Token[RequestLabels | None]:
    """Make `labels` the current request's, until `reset_current` with the token returned."""
    return _current.set(labels)


def reset_current(token: Token[RequestLabels | None]) -> None:
    _current.reset(token)


class tracking:  # lower case: called as the function it replaced, `with tracking(labels):`
    """Make `labels` (or fresh ones) the current request's labels for the duration (a class,
    not a generator: it wraps every request)."""

    __slots__ = ("labels", "token")

    def __init__(self, labels: RequestLabels | None = None) -> None:
        self.labels = labels if labels is not None else RequestLabels()

    def __enter__(self) -> RequestLabels:
        self.token = set_current(self.labels)
        return self.labels

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        reset_current(self.token)


def plain_scope(route: str, method: str) -> AbstractContextManager[RequestLabels]:
    """A RequestScope that only tracks labels (no metrics)."""
    return tracking()


def current() -> RequestLabels | None:
    return _current.get()


def note_model(name: str) -> None:
    """The request reached served model `name`."""
    labels = _current.get()
    if labels is not None and labels.model != name:
        labels.model, labels.version = name, ""


def note_method(method: str) -> None:
    """The request asks for `method` (predict, classify, regress)."""
    labels = _current.get()
    if labels is not None:
        labels.method = method


def note_version(name: str, version: int) -> None:
    """The request is served by `version` of model `name`."""
    labels = _current.get()
    if labels is not None:
        labels.model, labels.version = name, str(version)
