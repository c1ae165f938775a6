"""Who may call what, decided once for every door: the throttle, then the key (an API key or a
SigV4 signature), then its scope and model — with one audit line and one metric per refusal.

HTTP's key check, gRPC's interceptor and the runtime API's signature check all ask `Access`;
each only turns a `Refused` into its protocol's answer (401/403/429, UNAUTHENTICATED /
PERMISSION_DENIED / RESOURCE_EXHAUSTED, AWS's exception names). There is one throttle per
server: every door's failures count in it, and with the supervisor's table every worker's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tfservo.auth.keys import KeyRing, NotAllowed, Unauthenticated, bearer
from tfservo.auth.throttle import FailureThrottle
from tfservo.core.errors import ResourceExhausted, ServingError

if TYPE_CHECKING:
    from tfservo.auth.audit import ManagementGate
    from tfservo.auth.sigv4 import Credentials, SigV4Verifier

__all__ = ["Access", "Caller", "Throttled"]

_LOADS = frozenset({"load", "manage"})  # the scopes that may load a Target-Model on first use

audit = logging.getLogger("tfservo.audit")


class Throttled(ResourceExhausted):
    """A peer that failed too often, refused before its key is looked at; `retry_after` seconds."""

    retry_after: float

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Caller:
    """Whom a door let in: the key's name and scopes (None: every scope, a SigV4 key's)."""

    name: str
    scopes: frozenset[str] | None = None


class Access:
    """The server's key ring and signature keys (either may be None) and its one throttle."""

    def __init__(
        self,
        throttle: FailureThrottle,
        ring: KeyRing | None = None,
        sigv4: SigV4Verifier | None = None,
        on_refused: Callable[[str], None] = lambda reason: None,
        *,
        open_runtime: bool = False,
    ) -> None:
        self.throttle = throttle
        self.ring = ring
        self.sigv4 = sigv4
        self.open_runtime = open_runtime  # --open-runtime-api: the runtime API takes no bearer key
        self.on_refused = on_refused  # ("unauthenticated" | "forbidden" | "throttled"): the metric

    def check_key(
        self, peer: str, token: str | None, needed: str, what: str, model: Callable[[], str | None] = lambda: None,
    ) -> Caller:
        """The API key `token` if it may do `what` (a request line, or "grpc METHOD")
        with scope `needed`; `model()` names the model the request is for (None: none), asked only
        for a key limited to some models.
        Raises Throttled, Unauthenticated or NotAllowed, each after its audit line."""
        assert self.ring is not None, "check_key needs --api-keys"
        self._not_held(peer, what)
        try:
            key = self.ring.authenticate(token)
        except Unauthenticated as exc:
            self.throttle.failed(peer)
            self._refused("unauthenticated", peer, "-", what, exc, needed)
            raise
        named = model() if key.models is not None else None
        try:
            self.ring.authorize(key, needed, named)
        except NotAllowed as exc:
            self._refused("forbidden", peer, key.name, what, exc, needed, named)
            raise
        return Caller(key.name, key.scopes)

    def check_signature(self, peer: str, what: str, verify: Callable[[SigV4Verifier], Credentials]) -> Credentials:
        """The SigV4 key `verify` accepts, or Throttled / its SignatureRefused after an audit line."""
        from tfservo.auth.sigv4 import SignatureRefused

        assert self.sigv4 is not None, "check_signature needs --sigv4-credentials"
        self._not_held(peer, what)
        try:
            key = verify(self.sigv4)
        except SignatureRefused as exc:
            self.throttle.failed(peer)
            audit.warning("refused sigv4 peer=%s key=%s %s error=%s: %s", peer, exc.key or "-", what,
                          exc.error_type, exc.message)
            self.on_refused("unauthenticated")
            raise
        audit.debug("sigv4 key=%s (%s) %s", key.access_key, key.name, what)
        return key

    @property
    def guards_runtime(self) -> bool:
        """Whether SageMaker's runtime API checks who calls: a signature (--sigv4-credentials) or a
        bearer key (--api-keys, unless --open-runtime-api)."""
        return self.sigv4 is not None or (self.ring is not None and not self.open_runtime)

    def check_runtime(
        self, peer: str, authorization: str | None, what: str, verify: Callable[[SigV4Verifier], Credentials],
        model: Callable[[], str | None],
    ) -> Caller:
        """Who calls the runtime API: the SigV4 key that signed it (with
        --sigv4-credentials; the only way without --api-keys) or of its bearer key with scope
        invoke. Raises Throttled, SignatureRefused, Unauthenticated or NotAllowed."""
        signed = (authorization or "").startswith("AWS4-")
        if self.sigv4 is not None and (signed or self.ring is None or self.open_runtime):
            return Caller(self.check_signature(peer, what, verify).name)
        return self.check_key(peer, bearer(authorization), "invoke", what, model)

    def check_load(self, gate: ManagementGate, who: Caller | None, peer: str, what: str, target: str) -> None:
        """A Target-Model not loaded yet is a load, which runs the archive's code: allowed where
        management answers (--management) and, under --api-keys, for a key with scope load or
        manage. Raises NotAllowed after its audit line."""
        if not gate.open:
            exc = NotAllowed(f"X-Amzn-SageMaker-Target-Model {target} is not loaded, and loading it is model "
                             f"management: {gate.off_message}")
            self._refused("forbidden", peer, who.name if who else "-", what, exc, "load", target)
            raise exc
        if who is not None and who.scopes is not None and not who.scopes & _LOADS:
            exc = NotAllowed(f"API key {who.name!r} may call loaded models only: X-Amzn-SageMaker-Target-Model "
                             f"{target} is not loaded, and loading it needs scope load (or manage)")
            self._refused("forbidden", peer, who.name, what, exc, "load", target)
            raise exc

    def close(self) -> None:
        self.throttle.close()

    def _not_held(self, peer: str, what: str) -> None:
        wait = self.throttle.held(peer)
        if wait:
            audit.warning("refused throttled peer=%s %s: %.0f s to wait", peer, what, wait)
            self.on_refused("throttled")
            raise Throttled(f"too many failed authentications from {peer}: retry in {math.ceil(wait)} s", wait)

    def _refused(
        self, reason: str, peer: str, key: str, what: str, exc: ServingError, needed: str, model: str | None = None,
    ) -> None:
        audit.warning("refused %s peer=%s key=%s %s scope=%s model=%s: %s", reason, peer, key, what, needed,
                      model or "-", exc.message)
        self.on_refused(reason)
