"""The start-up line that says which doors are open to whom, and the warning when a server
anyone can reach checks no one (not inside SageMaker, whose front end authenticates)."""

from __future__ import annotations

import logging

from tfservo.auth.audit import ManagementGate
from tfservo.core.settings import Settings, is_loopback

__all__ = ["access_line", "log_access"]

log = logging.getLogger("tfservo.audit")


def access_line(settings: Settings) -> tuple[int, str]:
    """(log level, line): who may call each door; WARNING when nothing guards a reachable port."""
    loopback = is_loopback(settings.host)
    runtime = " or ".join(
        ([f"SigV4 with the keys in {settings.sigv4_credentials}"] if settings.sigv4_credentials else [])
        + (["API keys with scope invoke"] if settings.api_keys and not settings.open_runtime_api else [])
    ) or "open"
    others = f"API keys with scopes from {settings.api_keys}" if settings.api_keys else "open"
    tls = "; HTTPS clients need a certificate from --tls-ca" if settings.tls_ca else ""
    where = "this host only" if loopback else "other hosts too"
    line = (f"access: runtime API {runtime}; other doors {others}; health probes open{tls}; "
            f"{ManagementGate(settings).describe()}; listening on {settings.host} ({where})")
    guarded = settings.sigv4_credentials or settings.api_keys or settings.tls_ca
    if not loopback and not guarded and not settings.in_sagemaker:
        return logging.WARNING, (
            f"{line}: anyone who reaches this port can invoke and read models; add --api-keys and "
            "--sigv4-credentials, or listen on 127.0.0.1"
        )
    return logging.INFO, line


def log_access(settings: Settings) -> None:
    level, line = access_line(settings)
    log.log(level, "%s", line)
