"""HTTP routes: SageMaker's /ping and /invocations and TF Serving's REST API on one port.

The app only maps HTTP to the service: it parses paths and headers, runs the call in a
worker thread and turns ServingErrors into {"error": ...} with TF Serving's status codes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

import anyio
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tfservo.errors import InvalidArgument, ServingError
from tfservo.sagemaker.invocation import InvocationResult, error_result
from tfservo.sagemaker.service import ModelService

log = logging.getLogger("tfservo.http")

JSON = "application/json"
CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"

_TFS_PATH = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)"
    r"(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
    r"(?::(?P<method>[^/:]+)|/(?P<meta>metadata))?/?$"
)


def json_response(doc: object, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type=JSON)


def error_response(exc: ServingError) -> Response:
    return _result_response(error_result(exc))


def _result_response(result: InvocationResult) -> Response:
    return Response(result.body, status_code=result.status, media_type=result.content_type)


class PayloadTooLarge(ServingError):
    http_status = 413


async def read_body(request: Request, limit_bytes: int) -> bytes:
    """The request body, refusing (413) anything over the limit before reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidArgument(f"Content-Length {declared!r} is not a number")
        if int(declared) > limit_bytes:
            raise PayloadTooLarge(_too_large(int(declared), limit_bytes))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise PayloadTooLarge(_too_large(size, limit_bytes))
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> str:
    return (
        f"Request body of {size} bytes is over the limit of {limit} bytes "
        f"({limit / 2**20:g} MB); send less or start the server with a larger --max-request-mb"
    )


def build_app(
    service: ModelService,
    *,
    max_request_bytes: int = 100 * 2**20,
    extra_routes: list[Route] | None = None,
    execution_parameters: dict[str, object] | None = None,
) -> Starlette:
    """The ASGI app serving `service`."""
    limiter = anyio.CapacityLimiter(64)  # model calls
    invoke_limiter = anyio.CapacityLimiter(64)  # handler calls may re-enter the REST API

    async def in_thread(fn: Callable[[], object], lim: anyio.CapacityLimiter = limiter):
        return await anyio.to_thread.run_sync(fn, limiter=lim)

    async def ping(request: Request) -> Response:
        missing = service.unavailable_models()
        if not missing:
            return Response(b"", status_code=200)
        names = ", ".join(missing)
        return json_response(
            {"error": f"no AVAILABLE version of model(s) {names}; GET /v1/models/NAME shows why"}, 503
        )

    async def invocations(request: Request) -> Response:
        return await _invoke(request, request.path_params.get("name"))

    async def _invoke(request: Request, model_name: str | None) -> Response:
        try:
            body = await read_body(request, max_request_bytes)
        except ServingError as exc:
            return error_response(exc)
        headers = request.headers
        result = await in_thread(
            lambda: service.invoker.invoke(
                body,
                headers.get("content-type"),
                headers.get("accept"),
                headers.get(CUSTOM_ATTRIBUTES),
                model_name,
            ),
            invoke_limiter,
        )
        return _result_response(result)

    async def tfs_rest(request: Request) -> Response:
        match = _TFS_PATH.match(request.url.path)
        if not match:
            return json_response({"error": f"Malformed request: {request.method} {request.url.path}"}, 404)
        name, version_s, label = match["name"], match["version"], match["label"]
        method, meta = match["method"], match["meta"]
        try:
            version = _parse_version(version_s)
            if request.method == "GET":
                if method:
                    raise _MethodNotAllowed(f"Use POST for :{method}")
                if meta:
                    doc = await in_thread(lambda: service.api.metadata(name, version, label))
                else:
                    doc = await in_thread(lambda: service.api.status(name, version, label))
                return json_response(doc)
            if request.method != "POST" or not method:
                raise _MethodNotAllowed(
                    "Use GET /v1/models/{name}[/metadata] or POST /v1/models/{name}:{predict|classify|regress}"
                )
            if method not in ("predict", "classify", "regress"):
                return json_response(
                    {"error": f"Malformed request: unknown method :{method}; use :predict, :classify or :regress"},
                    404,
                )
            body = await read_body(request, max_request_bytes)
            out = await in_thread(lambda: service.api.rest(method, name, version, label, body))
            return Response(out, media_type=JSON)
        except ServingError as exc:
            return error_response(exc)

    async def exec_params(request: Request) -> Response:
        return json_response(execution_parameters or {})

    async def not_found(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 404:
            msg = f"No route for {request.method} {request.url.path}; see /ping, /invocations, /v1/models/{{name}}"
        elif exc.status_code == 405:
            msg = f"Method {request.method} is not allowed on {request.url.path}"
        else:
            msg = exc.detail
        return json_response({"error": msg}, exc.status_code)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return json_response({"error": f"Internal error: {type(exc).__name__}: {exc}"}, 500)

    routes = [
        Route("/ping", ping, methods=["GET"]),
        Route("/invocations", invocations, methods=["POST"]),
        Route("/execution-parameters", exec_params, methods=["GET"]),
        Route("/v1/models/{rest:path}", tfs_rest, methods=["GET", "POST"]),
        *(extra_routes or []),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={HTTPException: not_found, Exception: server_error},
    )


class _MethodNotAllowed(ServingError):
    http_status = 405


def _parse_version(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isdigit():
        raise InvalidArgument(f"Model version must be a number, got {text!r}")
    return int(text)
