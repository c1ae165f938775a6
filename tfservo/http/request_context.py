"""What the layers of one HTTP request tell each other: one typed record in the ASGI scope.

The hot dispatch names the route (metrics, access logs, traces) and its data-capture kind, the
hot route keeps the body it read (data capture, payload logs), and the protocol says how many
requests the server holds (whether a call may join a batch). One scope key holds all of it, so
a reader finds every field here, typed, instead of loose keys in the scope.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfservo.auth.access import Caller

__all__ = ["RequestContext", "context_of", "lone_request", "new_context", "peer_of"]

_KEY = "tfservo"


@dataclass(slots=True)
class RequestContext:
    """One request's notes. `route`: the name of the route that answered; `method`: its metrics
    `method` label, where it has one; `capture`: its data-capture kind ("invocation",
    "inference"); `body`: a hot route's body once read whole; `in_progress`: how many requests
    the server holds now (None when an app is called in-process); `caller`: the key let in."""

    route: str | None = None
    method: str | None = None
    capture: str | None = None
    body: bytes | None = None
    in_progress: Callable[[], int] | None = None
    caller: Caller | None = None  # whom the key check (or the runtime API's) let in; None: no keys
    # an endpoint of variants: the variant that answered, and the eventId its shadow's capture shares
    variant: str | None = None
    capture_id: str | None = None


def context_of(scope: MutableMapping[str, Any]) -> RequestContext:
    """This request's context, made on first use (the protocol makes it with the request)."""
    context = scope.get(_KEY)
    if context is None:
        context = scope[_KEY] = RequestContext()
    assert isinstance(context, RequestContext)
    return context


def lone_request(scope: MutableMapping[str, Any]) -> bool:
    """Whether the server holds no request but this one (asked when the request runs: none of
    the loop's turn is left to join its batch); False where the server does not say (an app
    called in-process)."""
    in_progress = context_of(scope).in_progress
    return in_progress is not None and in_progress() <= 1


def new_context(scope: MutableMapping[str, Any], in_progress: Callable[[], int]) -> None:
    """The protocol's part: the context, with the server's count of requests in progress."""
    scope[_KEY] = RequestContext(in_progress=in_progress)


def peer_of(scope: MutableMapping[str, Any]) -> str:
    """The client's address (what the throttle counts and audit lines name), "-" where the
    server does not know it (a Unix socket)."""
    client = scope.get("client")
    return str(client[0]) if client else "-"

