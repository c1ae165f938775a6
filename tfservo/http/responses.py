"""JSON responses for the Starlette routes: answers and errors in the protocol's own shape."""

from __future__ import annotations

import orjson
from starlette.responses import Response

from tfservo.codecs.media_types import JSON
from tfservo.core.errors import ServingError
from tfservo.core.status import error_body
from tfservo.service.invocation import error_result

__all__ = ["error_json", "error_response", "internal_error", "json_response"]


def json_response(doc: object, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type=JSON)


def error_json(message: str, status: int) -> Response:
    """An error the route itself words (a malformed path, a wrong method), in the protocol's shape."""
    return Response(error_body(message), status_code=status, media_type=JSON)


def error_response(exc: ServingError) -> Response:
    """A ServingError as {"error": "..."} with its status code."""
    result = error_result(exc)
    return Response(result.body, status_code=result.status, media_type=result.content_type)


def internal_error(exc: BaseException) -> Response:
    """A bug of ours, answered as JSON 500 rather than a crash or an HTML page."""
    return error_json(f"Internal error: {type(exc).__name__}: {exc}", 500)
