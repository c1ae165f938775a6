"""Canonical status code → HTTP status, exactly as TF Serving's REST server maps them."""

from __future__ import annotations

from tfservo.core.errors import Code

__all__ = ["http_status"]

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
