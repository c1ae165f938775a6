"""The HTTP server span: every request the app answers, continuing the caller's W3C trace.

Only used when tracing is on (core.tracing); the span carries HTTP's semantic-convention
attributes, named `{method} {route}` once the route table has named the route.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tfservo.core import tracing
from tfservo.http.request_context import context_of

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

__all__ = ["traced"]


async def traced(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """`app(scope, receive, send)` inside a SERVER span."""
    method = scope["method"]
    with tracing.server_span(method, tracing.header_carrier(scope["headers"]), lambda: _attributes(scope)) as span:
        if not span.sampled:  # its context still goes to the handler's calls; nothing more is noted
            await app(scope, receive, send)
            return
        status = 0

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(tracing.error_status(str(status)))
            await send(message)

        try:
            await app(scope, receive, send_noting_status)
        finally:
            route = context_of(scope).route or _starlette_route(scope)
            if route:
                span.set_attribute("http.route", route)
                span.update_name(f"{method} {route}")


def _attributes(scope: Scope) -> dict[str, AttributeValue]:
    """HTTP's semantic-convention attributes of the request (made only for a sampled one)."""
    attributes: dict[str, AttributeValue] = {
        "http.request.method": scope["method"],
        "url.path": scope["path"],
        "url.scheme": scope.get("scheme", "http"),
        "network.protocol.version": scope.get("http_version", "1.1"),
    }
    server, client = scope.get("server"), scope.get("client")
    if server:
        attributes["server.address"], attributes["server.port"] = server[0], server[1]
    if client:
        attributes["client.address"] = client[0]
    if scope.get("query_string"):
        attributes["url.query"] = scope["query_string"].decode("latin-1")
    for key, value in scope["headers"]:
        if key == b"user-agent":
            attributes["user_agent.original"] = value.decode("latin-1")
    return attributes


def _starlette_route(scope: Scope) -> str | None:
    """The path template of the Starlette route that answered, if one did."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else None
