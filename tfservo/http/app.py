"""The HTTP app: SageMaker's, TF Serving's, the runtime API's, multi-model and V2 routes on one port.

The routes are declared in routes.ROUTES; this module builds the endpoints they name and the
app that dispatches to them. Inference POSTs go straight to their hot route (HotDispatch);
everything else goes through a small Starlette app. ServingErrors become {"error": ...} with
TF Serving's status codes, never an HTML page.
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
from starlette.routing import BaseRoute
from starlette.types import Receive, Scope, Send

from tfservo.core import tracing
from tfservo.core.errors import ServingError
from tfservo.http.async_routes import AsyncRoutes
from tfservo.http.docs_page import DocsPage
from tfservo.http.hot_routes import HotRoutes
from tfservo.http.management_edge import gated
from tfservo.http.multi_model_routes import MultiModelRoutes
from tfservo.http.responses import error_json, error_response, internal_error, json_response
from tfservo.http.routes import Endpoints, HotDispatch, RouteSpec, starlette_routes, tfs_path_parts
from tfservo.http.tracing_edge import traced
from tfservo.http.v2_routes import V2Routes
from tfservo.http.variant_routes import VariantRoutes
from tfservo.models.calls import METHODS, parse_version
from tfservo.service.factory import ModelService

if TYPE_CHECKING:
    from tfservo.async_inference.intake import AsyncIntake
    from tfservo.http.capture_tap import HttpCapture
    from tfservo.service.runtime import Runtime

__all__ = ["build_app", "ServingApp"]

log = logging.getLogger("tfservo.http")


class ServingApp:
    """The ASGI app of one service: POSTs to hot routes go straight to their handler."""

    def __init__(
        self, hot: HotRoutes, dispatch: HotDispatch, starlette: Starlette, capture: HttpCapture | None = None,
    ) -> None:
        self.hot = hot
        self.dispatch = dispatch
        self.starlette = starlette
        self.capture = capture
        self.routes: list[BaseRoute] = starlette.routes
        self.closers: list[Callable[[], None]] = []  # what else stops with the app, first (asynchronous runs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if tracing.enabled() and scope["type"] == "http":
            await traced(self._answer, scope, receive, send)
        else:
            await self._answer(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.dispatch.route(scope)
            if handler is not None:
                if self.capture is not None:
                    handler = self.capture.wrap(scope, handler)
                try:
                    await handler(scope, receive, send)
                except Exception as exc:
                    log.exception("unhandled error on POST %s", scope["path"])
                    await internal_error(exc)(scope, receive, send)
                return
        await self.starlette(scope, receive, send)

    def close(self) -> None:
        for close in self.closers:
            close()  # the runtime's close among them: its call placements


async def _in_thread(fn: Any) -> Any:
    return await anyio.to_thread.run_sync(fn)


class Pages:
    """The server's own non-inference endpoints: health, TF Serving's GETs and its answers to
    malformed paths, the model list, execution parameters and /openapi.json."""

    def __init__(
        self, service: ModelService, execution_parameters: Mapping[str, object] | None, multi_model: bool,
        *, management: bool = True,
    ) -> None:
        self.service = service
        self._execution_parameters = execution_parameters or {}
        self.multi_model = multi_model
        self.management = management  # whether the management routes answer (and are documented)

    async def ping(self, request: Request) -> Response:
        missing = self.service.unavailable_models()
        if not missing:
            return Response(b"", status_code=200)
        names = ", ".join(missing)
        return error_json(f"no AVAILABLE version of model(s) {names}; GET /v1/models/NAME shows why", 503)

    async def tfs_status(self, request: Request) -> Response:
        """GET /v1/models/{name}[/versions/{v}|/labels/{l}]: the states of its versions."""
        return await self._tfs_get(request, self.service.api.status)

    async def tfs_metadata(self, request: Request) -> Response:
        """GET /v1/models/{name}[/versions/{v}|/labels/{l}]/metadata: its signatures."""
        return await self._tfs_get(request, self.service.api.metadata)

    async def _tfs_get(self, request: Request, get: Callable[[str, int | None, str | None], object]) -> Response:
        params = request.path_params
        try:
            version = parse_version(params.get("version"))
            return json_response(await _in_thread(lambda: get(params["name"], version, params.get("label"))))
        except ServingError as exc:
            return error_response(exc)

    async def tfs_malformed(self, request: Request) -> Response:
        """Whatever else comes to /v1/models/...: TF Serving's 404s and 405s, saying what to send."""
        parts = tfs_path_parts(request.url.path)
        if parts is None:
            return error_json(f"Malformed request: {request.method} {request.url.path}", 404)
        method = parts.get("method")
        try:
            parse_version(parts.get("version"))
        except ServingError as exc:
            return error_response(exc)
        if request.method == "GET" and method:
            return error_json(f"Use POST for :{method}", 405)
        if method and method not in METHODS:
            return error_json(f"Malformed request: unknown method :{method}; use :predict, :classify or :regress", 404)
        return error_json("Use GET /v1/models/{name}[/metadata] or POST /v1/models/{name}:{predict|classify|regress}", 405)

    async def execution_parameters(self, request: Request) -> Response:
        return json_response(self._execution_parameters)

    async def list_models(self, request: Request) -> Response:
        """GET /v1/models: every model with its versions and their states (TF Serving has none)."""
        service = self.service

        def models() -> dict[str, object]:
            return {"models": [{"name": name, **service.api.status(name, None, None)} for name in service.model_names()]}

        return json_response(await _in_thread(models))

    async def openapi(self, request: Request) -> Response:
        """GET /openapi.json: every route, with per-model schemas from the models served now."""
        from tfservo.http.openapi import openapi_document
        from tfservo.models.signatures import DEFAULT_SIGNATURE

        service = self.service

        def document() -> dict[str, object]:
            models: dict[str, Any] = {}
            for name in service.model_names():
                try:
                    with service.api.manager.acquire(name, None, None) as sv:
                        models[name] = sv.signatures.get(DEFAULT_SIGNATURE)
                except ServingError:  # no AVAILABLE version now
                    models[name] = None
            return openapi_document(models, multi_model=self.multi_model, management=self.management)

        return json_response(await _in_thread(document))

def build_app(runtime: Runtime, *, async_intake: AsyncIntake | None = None) -> ServingApp:
    """The ASGI app of `runtime`'s service, with the limits, time limits and runtime-API identity
    of its settings (the same for `serve` and for the loopback server in-process callers get),
    and the runtime's management gate, access check, capture taps and V2 data plane;
    `async_intake` queues InvokeEndpointAsync calls (--async-inference-config).

    Without batching, quick and small model calls run on the event loop (call_placement); with
    it, small predicts (every door's) are queued from the loop and answered from the batch thread.
    """
    service, settings, v2 = runtime.service, runtime.settings, runtime.v2
    multi_model = runtime.multi_model
    hot = HotRoutes(
        runtime,
        calls=runtime.placements.calls,
        invocations=runtime.placements.invocations,
        async_intake=async_intake,
    )

    async def not_found(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 404:
            msg = f"No route for {request.method} {request.url.path}; see /ping, /invocations, /v1/models/{{name}}"
        elif exc.status_code == 405:
            msg = f"Method {request.method} is not allowed on {request.url.path}"
        else:
            msg = exc.detail
        return error_json(msg, exc.status_code)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return internal_error(exc)

    mm = multi_model is not None
    endpoints = Endpoints(
        hot=hot,
        pages=Pages(service, settings.execution_parameters, mm, management=settings.management_open()[0]),
        v2=V2Routes(v2),
        docs=DocsPage(),
        async_=AsyncRoutes(async_intake.queue if async_intake is not None else None),
        variants=VariantRoutes(service.invoker, settings.variant_name),
        multi_model=MultiModelRoutes(multi_model) if multi_model is not None else None,
    )
    gate = runtime.gate

    def guard(spec: RouteSpec, endpoint: Any) -> Any:
        return gated(endpoint, gate, spec.name) if spec.scope == "manage" else endpoint

    starlette = Starlette(
        routes=starlette_routes(endpoints, multi_model=mm, guard=guard),
        exception_handlers={HTTPException: not_found, Exception: server_error},  # type: ignore[dict-item]
    )
    starlette.router.redirect_slashes = False  # a redirect built from the client's Host header helps no one
    capture = None
    if runtime.taps:
        from tfservo.http.capture_tap import HttpCapture

        capture = HttpCapture(runtime.taps)
    return ServingApp(hot, HotDispatch(endpoints, multi_model=mm), starlette, capture)
