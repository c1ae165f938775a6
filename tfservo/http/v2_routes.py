"""The Open Inference Protocol's GET routes (metadata, health, readiness); its POST .../infer is
a hot route (hot_routes.HotRoutes.v2_infer). Errors in V2's {"error": ...} shape."""

from __future__ import annotations

from typing import Any

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tfservo.core.errors import ServingError
from tfservo.core.v2_dataplane import V2DataPlane, parse_version
from tfservo.http.responses import error_response, json_response

__all__ = ["v2_routes"]


def v2_routes(plane: V2DataPlane) -> list[Route]:
    async def in_thread(fn: Any) -> Any:
        return await anyio.to_thread.run_sync(fn)

    async def server_metadata(request: Request) -> Response:
        return json_response(plane.server_metadata())

    async def live(request: Request) -> Response:
        return json_response({"live": True})

    async def ready(request: Request) -> Response:
        is_ready = plane.server_ready()
        return json_response({"ready": is_ready}, 200 if is_ready else 503)

    async def model_metadata(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            version = parse_version(request.path_params.get("version"))
            signature = request.query_params.get("signature_name")
            return json_response(await in_thread(lambda: plane.model_metadata(name, version, signature)))
        except ServingError as exc:
            return error_response(exc)

    async def model_ready(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            version = parse_version(request.path_params.get("version"))
            is_ready = await in_thread(lambda: plane.model_ready(name, version))
        except ServingError as exc:
            return error_response(exc)
        return json_response({"name": name, "ready": is_ready}, 200 if is_ready else 400)

    loads = anyio.CapacityLimiter(2)  # TF loads are CPU- and memory-heavy

    async def repository_index(request: Request) -> Response:
        try:
            body = await request.body()
            doc = orjson.loads(body) if body.strip() else {}
            ready_only = bool(doc.get("ready", False)) if isinstance(doc, dict) else False
            return json_response(await in_thread(lambda: plane.repository_index(ready_only)))
        except orjson.JSONDecodeError:
            return json_response({"error": 'the body must be JSON: {"ready": true|false} or nothing'}, 400)
        except ServingError as exc:
            return error_response(exc)

    async def repository_change(request: Request) -> Response:
        name = request.path_params["name"]
        change = plane.repository_load if request.url.path.endswith("/load") else plane.repository_unload
        try:
            await anyio.to_thread.run_sync(lambda: change(name), limiter=loads)
        except ServingError as exc:
            return error_response(exc)
        return json_response({})

    return [
        Route("/v2/repository/index", repository_index, methods=["POST"]),
        Route("/v2/repository/models/{name}/load", repository_change, methods=["POST"]),
        Route("/v2/repository/models/{name}/unload", repository_change, methods=["POST"]),
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/v2/models/{name}", model_metadata, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}", model_metadata, methods=["GET"]),
        Route("/v2/models/{name}/ready", model_ready, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}/ready", model_ready, methods=["GET"]),
    ]
