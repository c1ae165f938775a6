"""The one table of HTTP routes.

Each route is declared once — methods, path template, the endpoint that answers it, whether it
is a hot inference route, the `method` its metrics carry and its OpenAPI description — and
everything else is derived from the table: the fast dispatch of inference POSTs (`HotDispatch`),
the Starlette routes (`starlette_routes`), the route names of metrics and access logs, and
/openapi.json (openapi.py).

Each route's endpoint is a function of `Endpoints`, the objects build_app makes (`hot`: the
inference routes, `pages`: the server's GETs, `v2`: V2's GETs and repository, `models`:
SageMaker's /models, `docs`: the Swagger UI page, `async_`: async status), so mypy checks that
every route names a method that exists.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.convertors import Convertor, register_url_convertor
from starlette.routing import BaseRoute, Mount, Route, compile_path
from starlette.types import Receive, Scope, Send

from tfservo.http.request_context import context_of

if TYPE_CHECKING:
    from tfservo.http.app import Pages
    from tfservo.http.async_routes import AsyncRoutes
    from tfservo.http.docs_page import DocsPage
    from tfservo.http.hot_routes import HotRoutes
    from tfservo.http.multi_model_routes import MultiModelRoutes
    from tfservo.http.v2_routes import V2Routes
    from tfservo.http.variant_routes import VariantRoutes

__all__ = [
    "ROUTES",
    "Doc",
    "Endpoints",
    "HotDispatch",
    "RouteScopes",
    "RouteSpec",
    "starlette_routes",
    "tfs_path_parts",
]


AsgiHandler = Callable[[Scope, Receive, Send], Awaitable[None]]


class _Segment(Convertor[str]):
    """A path segment without ':' (TF Serving's model names, versions and labels end at ':method')."""

    regex = "[^/:]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


class _MaybeEmpty(_Segment):
    """A path segment that may be empty (the runtime API checks endpoint names itself)."""

    regex = "[^/]*"


class _TfsMethod(_Segment):
    regex = "predict|classify|regress"


register_url_convertor("segment", _Segment())
register_url_convertor("maybe_empty", _MaybeEmpty())
register_url_convertor("tfs_method", _TfsMethod())


@dataclass(frozen=True)
class Doc:
    """A route's OpenAPI description. `per_model`: one path per served model, `{name}` filled in
    (`needs`: only for models whose default signature exists: "signature", or the TF Serving
    methods it supports: "methods"). `body` and `ok` name shapes openapi.py builds."""

    summary: str
    tags: tuple[str, ...] = ()
    errors: tuple[int, ...] = (400, 404)
    body: str | None = None
    ok: str = "json"
    per_model: bool = False
    needs: str | None = None


@dataclass(frozen=True)
class Endpoints:
    """The objects whose methods answer the table's routes; `multi_model` only with --multi-model."""

    hot: HotRoutes
    pages: Pages
    v2: V2Routes
    docs: DocsPage
    async_: AsyncRoutes
    variants: VariantRoutes
    multi_model: MultiModelRoutes | None = None

    @property
    def models(self) -> MultiModelRoutes:
        """SageMaker's /models routes (asked for only where the table serves them: --multi-model)."""
        if self.multi_model is None:
            raise LookupError("the /models routes are served only with --multi-model")
        return self.multi_model


Endpoint = Callable[[Endpoints], Callable[..., Any]]


@dataclass(frozen=True)
class RouteSpec:
    """One HTTP route. `slash`: also answered with a trailing slash. `multi_model`: only served
    with --multi-model. A route without `endpoint` is answered outside the app (/metrics, by the
    metrics middleware) and only documented."""

    methods: tuple[str, ...]
    path: str
    endpoint: Endpoint | None
    hot: bool = False
    metric_method: str | None = None
    slash: bool = False
    multi_model: bool = False
    mount: bool = False
    doc: Doc | None = None
    label: str | None = None  # the name metrics and logs use, where not the template's
    capture: str | None = None  # data capture: "invocation" (SageMaker's), "inference" (TF Serving's, V2's)
    # --api-keys: the scope a key needs here (auth.keys.SCOPES); None: open (health probes, and the
    # runtime API, which SigV4 guards instead)
    scope: str | None = "read"

    @functools.cached_property  # read for every request
    def name(self) -> str:
        """What metrics, logs and OpenAPI call the route: the template without convertors."""
        return self.label or re.sub(r"\{(\w+):\w+\}", r"{\1}", self.path)


_SM, _TFS, _V2, _OPS, _MM = ("SageMaker",), ("TF Serving",), ("V2",), ("Operations",), ("Multi-model",)
_TFS_PREFIXES = ("/v1/models/{name:segment}", "/v1/models/{name:segment}/versions/{version:segment}",
                 "/v1/models/{name:segment}/labels/{label:segment}")

def _v2(method: str) -> Endpoint:
    """V2Routes' `method`, as a route's endpoint (the shared-memory routes, one per kind)."""
    return lambda e: getattr(e.v2, method)


ROUTES: tuple[RouteSpec, ...] = (
    # SageMaker
    RouteSpec(("GET",), "/ping", lambda e: e.pages.ping, scope=None, doc=Doc(
        "SageMaker health check: 200 when every model is available", _SM, errors=(503,), ok="empty")),
    RouteSpec(("POST",), "/invocations", lambda e: e.hot.invoke, hot=True, capture="invocation", scope="invoke", doc=Doc(
        "SageMaker invocation: the default model (or tfs-model-name) through the bundle's handlers or "
        "content conversions", _SM, errors=(400, 404, 415, 500), body="invocations")),
    RouteSpec(("POST",), "/endpoints/{EndpointName:maybe_empty}/invocations", lambda e: e.hot.runtime_invoke, hot=True,
              slash=True, capture="invocation", scope=None, doc=Doc("SageMaker runtime API (boto3, the AWS CLI, the SDK)", _SM, errors=(), body="runtime")),
    RouteSpec(("POST",), "/endpoints/{EndpointName:maybe_empty}/async-invocations", lambda e: e.hot.runtime_invoke_async,
              hot=True, slash=True, scope=None, doc=Doc(
        "SageMaker runtime API: InvokeEndpointAsync (with --async-inference-config)", _SM, errors=(), body="runtime_async")),
    RouteSpec(("GET",), "/async-invocations/{InferenceId}", lambda e: e.async_.status, doc=Doc(
        "Where one asynchronous request stands (tfservo's, for local debugging)", _SM, errors=(404,))),
    RouteSpec(("GET",), "/endpoint/variants", lambda e: e.variants.describe, doc=Doc(
        "The endpoint's production variants with their current weights and instance counts, and its shadow "
        "variants", _SM, errors=())),
    RouteSpec(("POST",), "/endpoint/variants/weights", lambda e: e.variants.update_weights, scope="manage", doc=Doc(
        "UpdateEndpointWeightsAndCapacities: new weights for the whole server, without dropping a request", _SM,
        errors=(400, 403), body="json")),
    RouteSpec(("GET",), "/execution-parameters", lambda e: e.pages.execution_parameters,
              doc=Doc("Batch transform's execution parameters", _SM, errors=())),
    RouteSpec(("GET",), "/metrics", None, scope="metrics", doc=Doc("Prometheus metrics", _OPS, errors=(), ok="text")),
    # TF Serving REST
    RouteSpec(("GET",), "/v1/models", lambda e: e.pages.list_models, doc=Doc("Every model with its versions and states", _TFS, errors=())),
    *(RouteSpec(("POST",), f"{prefix}:{{method:tfs_method}}", lambda e: e.hot.tfs_method, hot=True, slash=True, capture="inference",
                scope="invoke",
                doc=Doc("{method} with {name}", per_model=True, needs="methods", body="tfs") if i == 0 else None)
      for i, prefix in enumerate(_TFS_PREFIXES)),
    *(RouteSpec(("GET",), prefix, lambda e: e.pages.tfs_status, metric_method="status", slash=True,
                doc=Doc("Status of {name}'s versions", per_model=True) if i == 0 else None)
      for i, prefix in enumerate(_TFS_PREFIXES)),
    *(RouteSpec(("GET",), f"{prefix}/metadata", lambda e: e.pages.tfs_metadata, metric_method="metadata", slash=True,
                doc=Doc("Signatures of {name}", per_model=True) if i == 0 else None)
      for i, prefix in enumerate(_TFS_PREFIXES)),
    # Anything else under /v1/models: TF Serving's answers to malformed requests (404/405).
    RouteSpec(("GET", "POST"), "/v1/models/{rest:path}", lambda e: e.pages.tfs_malformed),
    # Operations
    RouteSpec(("GET",), "/openapi.json", lambda e: e.pages.openapi, doc=Doc("This document", _OPS, errors=())),
    RouteSpec(("GET",), "/docs", lambda e: e.docs.page, doc=Doc(
        "This document as a page (Swagger UI) to read it and send requests", _OPS, errors=(), ok="html")),
    RouteSpec(("GET",), "/docs/assets", lambda e: e.docs.assets, mount=True),
    # Open Inference Protocol (V2)
    RouteSpec(("POST",), "/v2/repository/index", lambda e: e.v2.repository_index),
    RouteSpec(("POST",), "/v2/repository/models/{name}/load", lambda e: e.v2.repository_load, scope="manage"),
    RouteSpec(("POST",), "/v2/repository/models/{name}/unload", lambda e: e.v2.repository_unload, scope="manage"),
    RouteSpec(("GET",), "/v2", lambda e: e.v2.server_metadata, doc=Doc("V2 server metadata", _V2, errors=())),
    RouteSpec(("GET",), "/v2/health/live", lambda e: e.v2.live, scope=None, doc=Doc("V2 liveness", _V2, errors=())),
    RouteSpec(("GET",), "/v2/health/ready", lambda e: e.v2.ready, scope=None, doc=Doc("V2 readiness", _V2, errors=(503,))),
    RouteSpec(("GET",), "/v2/models/stats", lambda e: e.v2.model_statistics,
              doc=Doc("V2 statistics of every model", _V2, errors=())),  # before {name}: "stats" is no model
    RouteSpec(("GET",), "/v2/models/{name}/stats", lambda e: e.v2.model_statistics,
              doc=Doc("V2 statistics of {name}'s versions", per_model=True)),
    RouteSpec(("GET",), "/v2/models/{name}/versions/{version}/stats", lambda e: e.v2.model_statistics),
    RouteSpec(("GET",), "/v2/models/{name}/config", lambda e: e.v2.model_config,
              doc=Doc("V2 configuration of {name} (Triton's ModelConfig fields)", per_model=True)),
    RouteSpec(("GET",), "/v2/models/{name}/versions/{version}/config", lambda e: e.v2.model_config),
    RouteSpec(("GET",), "/v2/models/{name}", lambda e: e.v2.model_metadata, doc=Doc("V2 metadata of {name}", per_model=True)),
    RouteSpec(("GET",), "/v2/models/{name}/versions/{version}", lambda e: e.v2.model_metadata),
    RouteSpec(("GET",), "/v2/models/{name}/ready", lambda e: e.v2.model_ready, doc=Doc("Whether {name} is ready", per_model=True)),
    RouteSpec(("GET",), "/v2/models/{name}/versions/{version}/ready", lambda e: e.v2.model_ready),
    *(route for kind, prefix in (("system", "shm"), ("cuda", "cuda")) for route in (
        RouteSpec(("GET",), f"/v2/{kind}sharedmemory/status", _v2(f"{prefix}_status"), doc=Doc(
            f"V2 {kind} shared-memory regions registered", _V2, errors=(501,), ok="list")),
        RouteSpec(("GET",), f"/v2/{kind}sharedmemory/region/{{name}}/status", _v2(f"{prefix}_status")),
        RouteSpec(("POST",), f"/v2/{kind}sharedmemory/region/{{name}}/register", _v2(f"{prefix}_register"),
                  scope="invoke", doc=Doc(f"Register a {kind} shared-memory region", _V2, errors=(400, 403, 501))),
        RouteSpec(("POST",), f"/v2/{kind}sharedmemory/unregister", _v2(f"{prefix}_unregister"), scope="invoke"),
        RouteSpec(("POST",), f"/v2/{kind}sharedmemory/region/{{name}}/unregister", _v2(f"{prefix}_unregister"),
                  scope="invoke"),
    )),
    RouteSpec(("POST",), "/v2/models/{name}/infer", lambda e: e.hot.v2_infer, hot=True, metric_method="predict",
              capture="inference", scope="invoke", doc=Doc(
        "V2 inference with {name}", per_model=True, needs="signature", body="v2")),
    RouteSpec(("POST",), "/v2/models/{name}/versions/{version}/infer", lambda e: e.hot.v2_infer, hot=True,
              metric_method="predict", label="/v2/models/{name}/infer", capture="inference", scope="invoke"),
    # SageMaker multi-model (--multi-model)
    RouteSpec(("POST",), "/models", lambda e: e.models.load, multi_model=True, scope="manage", doc=Doc(
        "Load a model dir under the model root", _MM, errors=(400, 403, 404, 409, 507), body="load")),
    RouteSpec(("GET",), "/models", lambda e: e.models.list_models, multi_model=True,
              doc=Doc("Loaded models", _MM, errors=())),
    RouteSpec(("GET",), "/models/{name}", lambda e: e.models.describe, multi_model=True),
    RouteSpec(("DELETE",), "/models/{name}", lambda e: e.models.unload, multi_model=True, scope="manage"),
    RouteSpec(("POST",), "/models/{name}/invoke", lambda e: e.hot.invoke, hot=True, slash=True, multi_model=True,
              capture="invocation", scope="invoke"),
)


# TF Serving's REST paths in each of their forms, any method name: how the answers to the
# requests no route took (404/405 in TF Serving's words) read what such a path asked for.
_TFS_FORMS = tuple(compile_path(prefix + suffix)[0] for prefix in _TFS_PREFIXES
                   for suffix in (":{method:segment}", "/metadata", ""))


def tfs_path_parts(path: str) -> dict[str, str] | None:
    """The name, version, label and method a TF Serving REST path names (those it has), or
    None for a path of no TF Serving form."""
    if path.endswith("/") and len(path) > 1:
        path = path[:-1]
    for pattern in _TFS_FORMS:
        match = pattern.match(path)
        if match is not None:
            return match.groupdict()
    return None


def _served(spec: RouteSpec, multi_model: bool) -> bool:
    return spec.endpoint is not None and (multi_model or not spec.multi_model)


def _resolve(spec: RouteSpec, endpoints: Endpoints) -> Any:
    assert spec.endpoint is not None  # _served
    return spec.endpoint(endpoints)


class _HotEndpoint:
    """A hot route in Starlette's table (so a wrong method is 405 and metrics name it); its POSTs
    are answered by HotDispatch before Starlette sees them."""

    def __init__(self, handler: AsgiHandler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send)


def starlette_routes(
    endpoints: Endpoints, *, multi_model: bool, guard: Callable[[RouteSpec, Any], Any] = lambda spec, endpoint: endpoint,
) -> list[BaseRoute]:
    """The table's routes for Starlette, in order (hot ones too, see _HotEndpoint); `guard`
    gives each endpoint as it is served (the management gate wraps the "manage" ones)."""
    routes: list[BaseRoute] = []
    for spec in ROUTES:
        if not _served(spec, multi_model):
            continue
        endpoint = guard(spec, _resolve(spec, endpoints))
        if spec.mount:
            routes.append(Mount(spec.path, app=endpoint, name=spec.name))
            continue
        if spec.hot:
            endpoint = _HotEndpoint(endpoint)
        paths = (spec.path, spec.path + "/") if spec.slash else (spec.path,)
        routes += [Route(path, endpoint, methods=list(spec.methods), name=spec.name) for path in paths]
    return routes


class HotDispatch:
    """POSTs to the table's hot routes, matched without Starlette (its request objects and
    routing were ~20 % of a small request's CPU): exact paths by dict, templates by prefix and
    one compiled pattern each."""

    def __init__(self, endpoints: Endpoints, *, multi_model: bool) -> None:
        self._exact: dict[str, tuple[RouteSpec, AsgiHandler]] = {}
        self._patterns: list[tuple[str, re.Pattern[str], RouteSpec, AsgiHandler]] = []
        for spec in ROUTES:
            if not (spec.hot and _served(spec, multi_model)):
                continue
            handler = _resolve(spec, endpoints)
            if "{" not in spec.path and not spec.slash:
                self._exact[spec.path] = (spec, handler)
                continue
            pattern, _, _ = compile_path(spec.path)
            if spec.slash:
                pattern = re.compile(pattern.pattern[:-1] + "/?$")
            self._patterns.append((spec.path.split("{", 1)[0], pattern, spec, handler))

    def route(self, scope: Scope) -> AsgiHandler | None:
        """The handler for a POST to this path (path parameters, route name and method noted in
        its context), or None: Starlette answers it."""
        path = scope["path"]
        hit = self._exact.get(path)
        if hit is not None:
            spec, handler = hit
            context = context_of(scope)
            context.route, context.capture = spec.name, spec.capture
            return handler
        for prefix, pattern, spec, handler in self._patterns:
            if path.startswith(prefix):
                match = pattern.match(path)
                if match is not None:
                    params = match.groupdict()
                    scope["path_params"] = params
                    method: str | None = params.get("method") or spec.metric_method
                    context = context_of(scope)
                    context.route = spec.name.replace("{method}", str(method)) if "method" in params else spec.name
                    context.capture, context.method = spec.capture, method
                    return handler
        return None


def metric_methods() -> dict[str, str]:
    """Route name → the `method` label of the requests it answers, where the table says."""
    return {spec.name: spec.metric_method for spec in ROUTES if spec.metric_method}


class RouteScopes:
    """The scope each request needs under --api-keys, from the table: the route whose path and
    method match (else the first whose path does: a wrong method still names its route), "read"
    for paths no route has; with the path parameters (the model a key may be limited to)."""

    _MAX_CACHED = 4096  # (method, path) pairs remembered; paths repeat (models, routes)

    def __init__(self, *, multi_model: bool) -> None:
        self._routes: list[tuple[re.Pattern[str], tuple[str, ...], str | None]] = []
        for spec in ROUTES:
            if spec.multi_model and not multi_model:
                continue
            paths = (spec.path + "/{path:path}",) if spec.mount else (spec.path, spec.path + "/") if spec.slash else (spec.path,)
            for path in paths:
                pattern, _, _ = compile_path(path)
                self._routes.append((pattern, spec.methods, spec.scope))
        self._cache: dict[tuple[str, str], tuple[str | None, dict[str, str]]] = {}

    def match(self, method: str, path: str) -> tuple[str | None, dict[str, str]]:
        """(scope needed, None when open; path parameters) of a request."""
        found = self._cache.get((method, path))
        if found is None:
            by_path: tuple[str | None, dict[str, str]] | None = None
            for pattern, methods, needed in self._routes:
                hit = pattern.match(path)
                if hit is None:
                    continue
                if method in methods or (method == "HEAD" and "GET" in methods):
                    found = (needed, hit.groupdict())
                    break
                by_path = by_path or (needed, hit.groupdict())
            found = found or by_path or ("read", {})
            if len(self._cache) >= self._MAX_CACHED:
                self._cache.clear()
            self._cache[(method, path)] = found
        return found
