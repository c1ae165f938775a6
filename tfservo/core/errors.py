"""Errors shared by every layer, each carrying a canonical status code.

The codes are TensorFlow's / gRPC's canonical ones, so the HTTP layer maps them the way
TF Serving does and the gRPC layer passes them through unchanged.
"""

from __future__ import annotations

import enum

import orjson

__all__ = [
    "AlreadyExists",
    "BundleError",
    "BundleNotFound",
    "Code",
    "error_from_response",
    "FailedPrecondition",
    "first_line",
    "HandlerError",
    "InsufficientMemory",
    "Internal",
    "InvalidArgument",
    "ModelLoadError",
    "NotAcceptable",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "PermissionDenied",
    "ResourceExhausted",
    "ServingError",
    "Unavailable",
    "Unimplemented",
    "UnsupportedMediaType",
]


class Code(enum.IntEnum):
    """Canonical status codes (same numbering as grpc.StatusCode and tf.errors)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class ServingError(Exception):
    """An error a caller can act on; `code` says which kind, the message says what to do."""

    code: Code = Code.INTERNAL
    retry_after: float | None = None  # seconds a caller should wait before trying again, if known

    def __init__(self, message: str, code: Code | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class InvalidArgument(ServingError):
    code = Code.INVALID_ARGUMENT


class NotFound(ServingError):
    code = Code.NOT_FOUND


class FailedPrecondition(ServingError):
    code = Code.FAILED_PRECONDITION


class Unimplemented(ServingError):
    code = Code.UNIMPLEMENTED


class ResourceExhausted(ServingError):
    code = Code.RESOURCE_EXHAUSTED


class Unavailable(ServingError):
    code = Code.UNAVAILABLE


class Overloaded(Unavailable):
    """More work than a model may take on: 503 with Retry-After (gRPC UNAVAILABLE); clients that
    honour it try again."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AlreadyExists(ServingError):
    code = Code.ALREADY_EXISTS


class PermissionDenied(ServingError):
    code = Code.PERMISSION_DENIED


class Internal(ServingError):
    code = Code.INTERNAL


class ModelLoadError(ServingError):
    """A model version could not be loaded; the message names the path and the cause."""

    code = Code.FAILED_PRECONDITION


class BundleError(ServingError):
    """A bundle (model dir, archive, URL) is not usable; the message says why and where."""

    code = Code.INVALID_ARGUMENT


class BundleNotFound(BundleError):
    """The bundle's path or URL does not exist (still a client's mistake, 400, where a bundle is
    given; callers that look a bundle up by name, like target models, answer 404)."""


class PayloadTooLarge(InvalidArgument):
    """A request body over the request-size limit (HTTP 413)."""


class UnsupportedMediaType(InvalidArgument):
    """The request's Content-Type cannot be converted without an inference.py handler (HTTP 415)."""


class NotAcceptable(InvalidArgument):
    """Nothing the Accept header allows can be produced (HTTP 406)."""


class InsufficientMemory(ResourceExhausted):
    """Loading a model would exhaust memory: the container's 507."""


class HandlerError(ServingError):
    """User code in inference.py raised; reported as 500 with the handler's own message."""

    code = Code.INTERNAL


def first_line(exc: BaseException | str) -> str:
    """The first line of an error's message (TF's run errors span many), for one-line errors."""
    text = exc if isinstance(exc, str) else (getattr(exc, "message", None) or str(exc) or type(exc).__name__)
    return text.strip().splitlines()[0].strip() if text.strip() else type(exc).__name__


_BY_STATUS: dict[int, type[ServingError]] = {
    400: InvalidArgument,
    404: NotFound,
    406: InvalidArgument,
    413: InvalidArgument,
    415: InvalidArgument,
    429: ResourceExhausted,
    501: Unimplemented,
    503: Unavailable,
}


def error_from_response(status: int, body: bytes, what: str) -> ServingError:
    """A non-2xx HTTP answer (`{"error": "..."}` or any body) as the ServingError of its kind: for
    callers that only have the answer (a remote endpoint, a handler's own error answer)."""
    try:
        doc = orjson.loads(body)
        text = doc["error"] if isinstance(doc, dict) and isinstance(doc.get("error"), str) else None
    except orjson.JSONDecodeError:
        text = None
    if text is None:
        text = body[:200].decode("utf-8", "replace").strip() or "(empty body)"
    kind = _BY_STATUS.get(status)
    if kind is None:
        kind = FailedPrecondition if 400 <= status < 500 else Internal
    if status == 504:
        return ServingError(f"{what} answered {status}: {text}", Code.DEADLINE_EXCEEDED)
    return kind(f"{what} answered {status}: {text}")
