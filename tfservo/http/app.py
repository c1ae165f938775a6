"""The HTTP app: SageMaker's /ping and /invocations and TF Serving's REST API on one port.

The app only maps HTTP to the service. Inference routes (hot_routes) are plain ASGI handlers
that `ServingApp` calls directly; the rest goes through a small Starlette app. ServingErrors
become {"error": ...} with TF Serving's status codes, never an HTML page.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from tfservo.core.api import METHODS
from tfservo.core.errors import ServingError
from tfservo.core.service import ModelService
from tfservo.http.call_placement import CallPlacement
from tfservo.http.decode_budget import DecodeBudget
from tfservo.http.hot_routes import TFS_PATH, HotRoutes, parse_version
from tfservo.http.responses import error_response, internal_error, json_response
from tfservo.http.runtime_api import DEFAULT_VARIANT

if TYPE_CHECKING:
    from tfservo.models.multi_model import MultiModelEndpoint
    from tfservo.models.target_models import TargetModels

__all__ = ["build_app", "ServingApp"]

log = logging.getLogger("tfservo.http")

_THREADS = 64  # model calls in flight at once per pool (calls, invocations)


class ServingApp:
    """The ASGI app of one service: POSTs to inference routes go straight to their handler."""

    def __init__(self, hot: HotRoutes, starlette: Starlette, endpoint: _AsgiEndpoint) -> None:
        self.hot = hot
        self.starlette = starlette
        self.endpoint = endpoint
        self.routes: list[BaseRoute] = starlette.routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.hot.route(scope)
            if handler is not None:
                try:
                    await handler(scope, receive, send)
                except Exception as exc:
                    log.exception("unhandled error on POST %s", scope["path"])
                    await internal_error(exc)(scope, receive, send)
                return
        await self.starlette(scope, receive, send)

    def close(self) -> None:
        self.hot.calls.close()
        self.hot.invocations.close()


class _AsgiEndpoint:
    """A hot route as a Starlette endpoint (Starlette wraps plain functions as request handlers)."""

    def __init__(self, hot: HotRoutes) -> None:
        self.hot = hot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.hot.route(scope)
        assert handler is not None  # Starlette matched the same path
        await handler(scope, receive, send)


def build_app(
    service: ModelService,
    *,
    max_request_bytes: int = 100 * 2**20,
    multi_model: MultiModelEndpoint | None = None,
    execution_parameters: Mapping[str, object] | None = None,
    max_decoding_bytes: int | None = None,
    targets: TargetModels | None = None,
    endpoint_name: str | None = None,
    variant_name: str = DEFAULT_VARIANT,
    request_timeout: float = 0.0,
    invocation_timeout: float = 0.0,
    on_timeout: Callable[[str, str | None, float], None] | None = None,
) -> ServingApp:
    """The ASGI app serving `service`.

    Without batching, quick and small model calls run on the event loop (call_placement); with
    it, small predicts are queued from the loop and answered from the batch thread.
    """
    from tfservo.core.v2_dataplane import V2DataPlane

    batched = service.batches
    # The one V2 data plane of this server: its REST routes and (run.py, loopback.py) its gRPC
    # service; with --multi-model its repository extension loads from the multi-model root.
    v2 = V2DataPlane(service.api, service.unavailable_models, repository=multi_model)
    hot = HotRoutes(
        service,
        v2=v2,
        max_request_bytes=max_request_bytes,
        calls=CallPlacement(_THREADS, "tfservo-call", inline=not batched),
        invocations=CallPlacement(_THREADS, "tfservo-invoke", inline=not batched),
        is_loaded=multi_model.is_loaded if multi_model is not None else None,
        batched=batched,
        budget=DecodeBudget(max_decoding_bytes) if max_decoding_bytes else None,
        targets=targets,
        endpoint_name=endpoint_name,
        variant=variant_name,
        request_timeout=request_timeout,
        invocation_timeout=invocation_timeout,
        on_timeout=on_timeout,
    )

    async def in_thread(fn: Any) -> Any:
        return await anyio.to_thread.run_sync(fn)

    async def ping(request: Request) -> Response:
        missing = service.unavailable_models()
        if not missing:
            return Response(b"", status_code=200)
        names = ", ".join(missing)
        return json_response(
            {"error": f"no AVAILABLE version of model(s) {names}; GET /v1/models/NAME shows why"}, 503
        )

    async def tfs_rest(request: Request) -> Response:
        """TF Serving's GETs (status, metadata), and the answers to malformed REST requests."""
        match = TFS_PATH.match(request.url.path)
        if not match:
            return json_response({"error": f"Malformed request: {request.method} {request.url.path}"}, 404)
        name, version_s, label = match["name"], match["version"], match["label"]
        method, meta = match["method"], match["meta"]
        try:
            version = parse_version(version_s)
            if request.method == "GET":
                if method:
                    raise _MethodNotAllowed(f"Use POST for :{method}")
                if meta:
                    doc = await in_thread(lambda: service.api.metadata(name, version, label))
                else:
                    doc = await in_thread(lambda: service.api.status(name, version, label))
                return json_response(doc)
            if method and method not in METHODS:
                return json_response(
                    {"error": f"Malformed request: unknown method :{method}; use :predict, :classify or :regress"},
                    404,
                )
            raise _MethodNotAllowed(
                "Use GET /v1/models/{name}[/metadata] or POST /v1/models/{name}:{predict|classify|regress}"
            )
        except ServingError as exc:
            return error_response(exc)

    async def exec_params(request: Request) -> Response:
        return json_response(execution_parameters or {})

    async def list_models(request: Request) -> Response:
        """GET /v1/models: every model with its versions and their states (TF Serving has none)."""
        def models() -> dict[str, Any]:
            return {"models": [{"name": name, **service.api.status(name, None, None)} for name in service.model_names()]}

        return json_response(await in_thread(models))

    async def openapi(request: Request) -> Response:
        """GET /openapi.json: every route, with per-model schemas from the models served now."""
        from tfservo.http.openapi import openapi_document
        from tfservo.models.signatures import DEFAULT_SIGNATURE

        def document() -> dict[str, Any]:
            models: dict[str, Any] = {}
            for name in service.model_names():
                try:
                    with service.api.manager.acquire(name, None, None) as sv:
                        models[name] = sv.signatures.get(DEFAULT_SIGNATURE)
                except ServingError:  # no AVAILABLE version now
                    models[name] = None
            return openapi_document(models, multi_model=multi_model is not None)

        return json_response(await in_thread(document))

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
        return internal_error(exc)

    from tfservo.http.docs_page import docs_routes

    endpoint = _AsgiEndpoint(hot)
    routes: list[BaseRoute] = [
        Route("/ping", ping, methods=["GET"]),
        Route("/invocations", endpoint, methods=["POST"]),
        Route("/execution-parameters", exec_params, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        *docs_routes(),
        Route("/v1/models/{rest:path}", tfs_rest, methods=["GET", "POST"]),
    ]
    from tfservo.http.v2_routes import v2_routes

    routes += v2_routes(hot.v2)
    routes += [  # answered as hot routes; listed so that a wrong method is 405 and metrics name them
        Route("/v2/models/{name}/infer", endpoint, methods=["POST"]),
        Route("/v2/models/{name}/versions/{version}/infer", endpoint, methods=["POST"]),
        Route("/endpoints/{name}/invocations", endpoint, methods=["POST"]),
    ]
    if multi_model is not None:
        from tfservo.http.multi_model_routes import multi_model_routes

        routes += multi_model_routes(multi_model, invoke=endpoint)
    starlette = Starlette(
        routes=routes,
        exception_handlers={HTTPException: not_found, Exception: server_error},  # type: ignore[dict-item]
    )
    starlette.router.redirect_slashes = False  # a redirect built from the client's Host header helps no one
    return ServingApp(hot, starlette, endpoint)


class _MethodNotAllowed(ServingError):
    http_status = 405
