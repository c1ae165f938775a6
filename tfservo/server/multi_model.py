"""HTTP routes of SageMaker's multi-model API: /models and /models/{name}/invoke.

Passed to `build_app(extra_routes=...)` when serving with --multi-model. Loading and the
model-root confinement live in tfservo.sagemaker.multi_model; invocations go through the
service's one Invoker with the model name from the path.
"""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tfservo.errors import NotFound, ServingError
from tfservo.sagemaker.multi_model import MultiModelEndpoint, parse_load_request
from tfservo.server.app import CUSTOM_ATTRIBUTES, error_response, json_response, read_body

_LOAD_BODY_LIMIT = 1 << 20  # a load request is a small JSON document


def multi_model_routes(endpoint: MultiModelEndpoint, *, max_request_bytes: int) -> list[Route]:
    """The /models routes for `endpoint` (its service answers the invocations)."""
    service = endpoint.service
    loads = anyio.CapacityLimiter(2)  # TF loads are CPU- and memory-heavy
    invokes = anyio.CapacityLimiter(64)

    async def load(request: Request) -> Response:
        try:
            name, url = parse_load_request(await read_body(request, _LOAD_BODY_LIMIT))
            doc = await anyio.to_thread.run_sync(lambda: endpoint.load(name, url), limiter=loads)
        except ServingError as exc:
            return error_response(exc)
        return json_response(doc)

    async def list_models(request: Request) -> Response:
        return json_response(await anyio.to_thread.run_sync(endpoint.list_models))

    async def describe(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            return json_response(await anyio.to_thread.run_sync(lambda: endpoint.describe(name)))
        except ServingError as exc:
            return error_response(exc)

    async def unload(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            doc = await anyio.to_thread.run_sync(lambda: endpoint.unload(name), limiter=loads)
        except ServingError as exc:
            return error_response(exc)
        return json_response(doc)

    async def invoke(request: Request) -> Response:
        name = request.path_params["name"]
        if not endpoint.is_loaded(name):
            return error_response(NotFound(f"Model {name} is not loaded yet."))
        try:
            body = await read_body(request, max_request_bytes)
        except ServingError as exc:
            return error_response(exc)
        headers = request.headers
        result = await anyio.to_thread.run_sync(
            lambda: service.invoker.invoke(
                body,
                headers.get("content-type"),
                headers.get("accept"),
                headers.get(CUSTOM_ATTRIBUTES),
                name,
            ),
            limiter=invokes,
        )
        return Response(result.body, status_code=result.status, media_type=result.content_type)

    return [
        Route("/models", load, methods=["POST"]),
        Route("/models", list_models, methods=["GET"]),
        Route("/models/{name}", describe, methods=["GET"]),
        Route("/models/{name}", unload, methods=["DELETE"]),
        Route("/models/{name}/invoke", invoke, methods=["POST"]),
    ]
