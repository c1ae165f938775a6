"""The HTTP management endpoints (routes whose scope is "manage") as the ManagementGate says:
404 saying how to turn them on while management is off, else the endpoint with one audit
line per request (peer, who, route, model, status)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message

from tfservo.auth.audit import ManagementGate
from tfservo.core.errors import NotFound, ServingError
from tfservo.http.hot_routes import read_body
from tfservo.http.responses import error_response

__all__ = ["gated"]

Endpoint = Callable[[Request], Awaitable[Response]]

_NAMING_BODY_LIMIT = 1 << 20  # a load request naming its model is a small JSON document


def gated(endpoint: Endpoint, gate: ManagementGate, route: str) -> Endpoint:
    """`endpoint` behind the gate."""
    if not gate.open:
        async def off(request: Request) -> Response:
            return error_response(NotFound(gate.off_message))

        return off

    async def audited(request: Request) -> Response:
        action = f"{request.method} {route}"
        peer = request.client.host if request.client else "-"
        model = request.path_params.get("name")
        if model is None:  # POST /models names its model in the body: read it here, hand it on
            try:
                body = await read_body(request.scope, request.receive, _NAMING_BODY_LIMIT)
            except ServingError as exc:
                refused = error_response(exc)
                gate.record("http", peer, action, None, str(refused.status_code))
                return refused
            model = _model_named(body)
            request = Request(request.scope, _replay(body))
        try:
            response = await endpoint(request)
        except BaseException:
            gate.record("http", peer, action, model, "500")
            raise
        gate.record("http", peer, action, model, str(response.status_code))
        return response

    return audited


def _model_named(body: bytes) -> str | None:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    name = doc.get("model_name") if isinstance(doc, dict) else None
    return name if isinstance(name, str) else None


def _replay(body: bytes) -> Callable[[], Awaitable[Message]]:
    """A receive that gives `body` once, as the endpoint would have read it."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive
