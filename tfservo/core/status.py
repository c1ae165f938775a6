"""An error's HTTP status: the canonical code's, exactly as TF Serving's REST server maps them,
except for the kinds of error HTTP has a status of its own for (413, 415, 406, 507). The one
place a status is decided; the edges write it (gRPC passes the canonical code through). The
body of an HTTP error is TF Serving's, SageMaker's and V2's shape alike: `{"error": "..."}`."""

from __future__ import annotations

import orjson

from tfservo.core.errors import (
    Code,
    InsufficientMemory,
    NotAcceptable,
    PayloadTooLarge,
    ServingError,
    UnsupportedMediaType,
)

__all__ = ["error_body", "error_status", "http_status"]

# From tensorflow_serving/model_servers/http_server.cc (ToHTTPStatusCode).
_HTTP_STATUS: dict[Code, int] = {
    Code.OK: 200,
    Code.CANCELLED: 499,  # "client closed request"
    Code.UNKNOWN: 500,
    Code.INVALID_ARGUMENT: 400,
    Code.DEADLINE_EXCEEDED: 504,
    Code.NOT_FOUND: 404,
    Code.ALREADY_EXISTS: 409,
    Code.PERMISSION_DENIED: 403,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.FAILED_PRECONDITION: 400,
    Code.ABORTED: 409,
    Code.OUT_OF_RANGE: 400,
    Code.UNIMPLEMENTED: 501,
    Code.INTERNAL: 500,
    Code.UNAVAILABLE: 503,
    Code.DATA_LOSS: 500,
    Code.UNAUTHENTICATED: 401,
}


def http_status(code: Code | int) -> int:
    """The HTTP status TF Serving answers with for a canonical code (unknown codes → 500)."""
    try:
        return _HTTP_STATUS[Code(code)]
    except ValueError:
        return 500


_BY_KIND: tuple[tuple[type[ServingError], int], ...] = (
    (PayloadTooLarge, 413),
    (UnsupportedMediaType, 415),
    (NotAcceptable, 406),
    (InsufficientMemory, 507),
)


def error_status(error: ServingError) -> int:
    """The HTTP status an error is answered with."""
    for kind, status in _BY_KIND:
        if isinstance(error, kind):
            return status
    return http_status(error.code)


def error_body(message: str) -> bytes:
    """An HTTP error's body: `{"error": message}`."""
    return orjson.dumps({"error": message})
