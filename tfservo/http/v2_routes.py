"""The Open Inference Protocol's GET routes (metadata, health, readiness) and its repository
extension; its POST .../infer is a hot route (HotRoutes.v2_infer). Paths are in routes.ROUTES;
errors in V2's {"error": ...} shape."""

from __future__ import annotations

from typing import Any

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response

from tfservo.core.errors import ServingError
from tfservo.http.request_context import peer_of
from tfservo.http.responses import error_json, error_response, json_response
from tfservo.service.v2_dataplane import V2DataPlane, parse_v2_version

__all__ = ["V2Routes"]


async def _in_thread(fn: Any) -> Any:
    return await anyio.to_thread.run_sync(fn)


class V2Routes:
    """The endpoints of V2's non-inference routes over one data plane."""

    def __init__(self, plane: V2DataPlane) -> None:
        self.plane = plane
        self._loads = anyio.CapacityLimiter(2)  # TF loads are CPU- and memory-heavy

    async def server_metadata(self, request: Request) -> Response:
        return json_response(self.plane.server_metadata())

    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, request: Request) -> Response:
        is_ready = self.plane.server_ready()
        return json_response({"ready": is_ready}, 200 if is_ready else 503)

    async def model_metadata(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            version = parse_v2_version(request.path_params.get("version"))
            signature = request.query_params.get("signature_name")
            return json_response(await _in_thread(lambda: self.plane.model_metadata(name, version, signature)))
        except ServingError as exc:
            return error_response(exc)

    async def model_config(self, request: Request) -> Response:
        """GET /v2/models/{name}[/versions/{version}]/config: the model configuration extension."""
        try:
            version = parse_v2_version(request.path_params.get("version"))
            name = request.path_params["name"]
            return json_response(await _in_thread(lambda: self.plane.model_config(name, version)))
        except ServingError as exc:
            return error_response(exc)

    async def model_statistics(self, request: Request) -> Response:
        """GET /v2/models[/{name}[/versions/{version}]]/stats: the statistics extension."""
        try:
            version = parse_v2_version(request.path_params.get("version"))
            name = request.path_params.get("name")
            return json_response(await _in_thread(lambda: self.plane.model_statistics(name, version)))
        except ServingError as exc:
            return error_response(exc)

    async def model_ready(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            version = parse_v2_version(request.path_params.get("version"))
            is_ready = await _in_thread(lambda: self.plane.model_ready(name, version))
        except ServingError as exc:
            return error_response(exc)
        return json_response({"name": name, "ready": is_ready}, 200 if is_ready else 400)

    async def repository_index(self, request: Request) -> Response:
        try:
            body = await request.body()
            doc = orjson.loads(body) if body.strip() else {}
            ready_only = bool(doc.get("ready", False)) if isinstance(doc, dict) else False
            return json_response(await _in_thread(lambda: self.plane.repository_index(ready_only)))
        except orjson.JSONDecodeError:
            return error_json('the body must be JSON: {"ready": true|false} or nothing', 400)
        except ServingError as exc:
            return error_response(exc)

    async def repository_load(self, request: Request) -> Response:
        body = await request.body()
        try:
            doc = orjson.loads(body) if body.strip() else {}
        except orjson.JSONDecodeError:
            return error_json('the body must be JSON: {"parameters": {...}} or nothing', 400)
        parameters = doc.get("parameters", {}) if isinstance(doc, dict) else None
        if not isinstance(parameters, dict):
            return error_json('"parameters" must be a JSON object', 400)
        return await self._change(lambda name: self.plane.repository_load(name, parameters), request.path_params["name"])

    async def repository_unload(self, request: Request) -> Response:
        return await self._change(self.plane.repository_unload, request.path_params["name"])

    async def _change(self, change: Any, name: str) -> Response:
        try:
            await anyio.to_thread.run_sync(lambda: change(name), limiter=self._loads)
        except ServingError as exc:
            return error_response(exc)
        return json_response({})

    # -- the shared-memory extensions (system's served; CUDA's refused, as an empty registry) ----

    async def shm_status(self, request: Request) -> Response:
        """GET /v2/systemsharedmemory[/region/{name}]/status."""
        name = request.path_params.get("name")
        try:
            return json_response(await _in_thread(lambda: self.plane.shm_status(name)))
        except ServingError as exc:
            return error_response(exc)

    async def shm_register(self, request: Request) -> Response:
        """POST /v2/systemsharedmemory/region/{name}/register: {"key", "offset", "byte_size"}."""
        name = request.path_params["name"]
        doc = await _register_body(request)
        if doc is None:
            return _NOT_A_REGISTRATION
        peer = peer_of(request.scope)
        try:
            await _in_thread(lambda: self.plane.shm_register(name, doc.get("key"), doc.get("offset", 0),
                                                             doc.get("byte_size"), peer))
        except ServingError as exc:
            return error_response(exc)
        return json_response({})

    async def shm_unregister(self, request: Request) -> Response:
        """POST /v2/systemsharedmemory[/region/{name}]/unregister (every region without a name)."""
        try:
            self.plane.shm_unregister(request.path_params.get("name"))
        except ServingError as exc:
            return error_response(exc)
        return json_response({})

    async def cuda_status(self, request: Request) -> Response:
        try:
            return json_response(self.plane.cuda_shm_status(request.path_params.get("name")))
        except ServingError as exc:
            return error_response(exc)

    async def cuda_register(self, request: Request) -> Response:
        if await _register_body(request) is None:
            return _NOT_A_REGISTRATION
        try:
            self.plane.cuda_shm_register()
        except ServingError as exc:
            return error_response(exc)
        return json_response({})

    async def cuda_unregister(self, request: Request) -> Response:
        return json_response({})  # nothing is ever registered


_NOT_A_REGISTRATION = error_json('the body must be a JSON object: {"key": "/name", "offset": 0, "byte_size": N}', 400)


async def _register_body(request: Request) -> dict[str, object] | None:
    """A register call's JSON object, None when the body is not one."""
    try:
        doc = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None
