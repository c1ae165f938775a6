"""HTTP routes of SageMaker's multi-model API: /models and /models/{name}/invoke.

Added by `build_app(multi_model=...)` when serving with --multi-model. Loading and the
model-root confinement live in tfservo.models.multi_model; invocations go through the
service's one Invoker with the model name from the path.
"""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from tfservo.core.errors import ServingError
from tfservo.http.hot_routes import read_body
from tfservo.http.responses import error_response, json_response
from tfservo.models.multi_model import MultiModelEndpoint, parse_load_request

__all__ = ["multi_model_routes"]

_LOAD_BODY_LIMIT = 1 << 20  # a load request is a small JSON document


def multi_model_routes(endpoint: MultiModelEndpoint, *, invoke: ASGIApp) -> list[Route]:
    """The /models routes for `endpoint`; `invoke` is the hot route answering /models/{name}/invoke."""
    loads = anyio.CapacityLimiter(2)  # TF loads are CPU- and memory-heavy

    async def load(request: Request) -> Response:
        try:
            name, url = parse_load_request(await read_body(request.scope, request.receive, _LOAD_BODY_LIMIT))
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

    return [
        Route("/models", load, methods=["POST"]),
        Route("/models", list_models, methods=["GET"]),
        Route("/models/{name}", describe, methods=["GET"]),
        Route("/models/{name}", unload, methods=["DELETE"]),
        Route("/models/{name}/invoke", invoke, methods=["POST"]),
    ]
