"""HTTP endpoints of SageMaker's multi-model API: /models and /models/{name} (paths in
routes.ROUTES; /models/{name}/invoke is a hot route).

Served when serving with --multi-model. Loading and the model-root confinement live in
tfservo.service.multi_model; invocations go through the service's one Invoker with the model
name from the path.
"""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import Response

from tfservo.core.errors import ServingError
from tfservo.http.hot_routes import read_body
from tfservo.http.responses import error_response, json_response
from tfservo.service.multi_model import MultiModelEndpoint, parse_load_request

__all__ = ["MultiModelRoutes"]

_LOAD_BODY_LIMIT = 1 << 20  # a load request is a small JSON document


class MultiModelRoutes:
    """The /models endpoints of one MultiModelEndpoint."""

    def __init__(self, endpoint: MultiModelEndpoint) -> None:
        self.endpoint = endpoint
        self._loads = anyio.CapacityLimiter(2)  # TF loads are CPU- and memory-heavy

    async def load(self, request: Request) -> Response:
        try:
            name, url = parse_load_request(await read_body(request.scope, request.receive, _LOAD_BODY_LIMIT))
            doc = await anyio.to_thread.run_sync(lambda: self.endpoint.load(name, url), limiter=self._loads)
        except ServingError as exc:
            return error_response(exc)
        return json_response(doc)

    async def list_models(self, request: Request) -> Response:
        return json_response(await anyio.to_thread.run_sync(self.endpoint.list_models))

    async def describe(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            return json_response(await anyio.to_thread.run_sync(lambda: self.endpoint.describe(name)))
        except ServingError as exc:
            return error_response(exc)

    async def unload(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            doc = await anyio.to_thread.run_sync(lambda: self.endpoint.unload(name), limiter=self._loads)
        except ServingError as exc:
            return error_response(exc)
        return json_response(doc)
