"""The HTTP edge of the metrics: every request counted, timed and access-logged, `GET /metrics`
(and TF Serving's metrics path) answered. The counting itself is `service.metrics.Metrics`,
which gRPC's servicers share."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import prometheus_client
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tfservo.core.request_labels import RequestLabels, reset_current, set_current
from tfservo.http.request_context import context_of
from tfservo.http.routes import metric_methods
from tfservo.service.metrics import METRICS_PATH, Metrics, access_level

if TYPE_CHECKING:
    from tfservo.service.factory import ModelService

__all__ = ["instrument"]

_METRIC_METHODS = metric_methods()


def instrument(app: ASGIApp, metrics: Metrics, service: ModelService | None = None, routes: Sequence[Any] = ()) -> ASGIApp:
    """`app` with every HTTP request counted and `GET /metrics` answered.

    `routes` (the Starlette app's) name each request's route by its path template; `service`
    names the model of invocations that never reach a model in-process (handlers).
    """
    return _HttpMetrics(app, metrics, service, routes)


class _HttpMetrics:
    """ASGI middleware: request metrics and access logs for every HTTP request, plus /metrics."""

    def __init__(self, app: ASGIApp, metrics: Metrics, service: ModelService | None, routes: Sequence[Any]) -> None:
        self.app = app
        self.metrics = metrics
        self.service = service
        self.routes = list(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Inline rather than through Metrics.request's context manager: this runs for every
        # request, and each layer of calls cost a microsecond or two (docs/decisions.md).
        path, verb = scope["path"], scope["method"]
        labels = RequestLabels(verb=verb, path=path)
        at = access_level()
        if at is not None:
            for key, value in scope["headers"]:
                if key == b"x-amzn-sagemaker-inference-id":
                    labels.inference_id = value.decode("latin-1")

        async def send_noting_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                labels.status = str(message["status"])
            elif message["type"] == "http.response.body":
                labels.bytes_out += len(message.get("body", b""))
            await send(message)

        metrics = self.metrics
        protocol = "v2" if path.startswith("/v2") and (len(path) == 3 or path[3] == "/") else "http"
        gauge = metrics.in_flight_child(protocol)
        tally = metrics.tally
        tally.inc(gauge)
        token = set_current(labels)
        started = time.perf_counter()
        try:
            exposition = self._exposition(path) if verb in ("GET", "HEAD") else None
            if exposition is not None:
                labels.route = path
                await self._expose(scope, send_noting_status, exposition)
            else:
                await self.app(scope, receive, send_noting_status)
        except BaseException:
            labels.status = labels.status or "500"
            raise
        finally:
            reset_current(token)
            if not labels.route:
                self._name(scope, labels)
            tally.inc(gauge, -1)
            metrics.record(protocol, labels, time.perf_counter() - started, "http", at)

    def _exposition(self, path: str) -> Callable[[], bytes] | None:
        """What GET `path` exposes, if it is a metrics path: tfservo's, or TF Serving's names."""
        metrics = self.metrics
        if path == METRICS_PATH:
            return metrics.exposition
        if metrics.tfs is not None and path == metrics.tfs_path:
            return metrics.tfs.exposition
        return None

    async def _expose(self, scope: Scope, send: Send, exposition: Callable[[], bytes]) -> None:
        body = await anyio.to_thread.run_sync(exposition)
        headers = [(b"content-type", prometheus_client.CONTENT_TYPE_LATEST.encode()),
                   (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    def _name(self, scope: Scope, labels: RequestLabels) -> None:
        """Route name and method of a request that has been answered (from the route table);
        the model if still unknown."""
        context = context_of(scope)
        route = context.route or self._template(scope)
        labels.route = route or "unmatched"
        method = context.method or _METRIC_METHODS.get(labels.route)
        if labels.route.startswith("/v1/models/"):  # TF Serving: the model is in the path
            if method:
                labels.method = method
            self._known_model(labels, (scope.get("path_params") or {}).get("name"))
            return
        if route == "/invocations" or (route or "").endswith(("/invoke", "/invocations", "/infer")):
            self._invocation_labels(scope, labels)

    def _template(self, scope: Scope) -> str | None:
        """The path template of the route that answered (a wrong method still names its route)."""
        partial = None
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                name: str = route.name
                return name
            if match is Match.PARTIAL and partial is None:
                partial = route.name
        return partial

    def _invocation_labels(self, scope: Scope, labels: RequestLabels) -> None:
        """The invoker noted method and model; a request that failed before it gets the defaults."""
        labels.method = labels.method or "predict"
        if not labels.model and self.service is not None:
            name = (scope.get("path_params") or {}).get("name")
            self._known_model(labels, name or self.service.default_model())

    def _known_model(self, labels: RequestLabels, name: str | None) -> None:
        # Only served names become label values: clients cannot grow the label set.
        if not labels.model and name and self.service is not None and self.service.manager.has_model(name):
            labels.model = name
