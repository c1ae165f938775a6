"""The gRPC server's connection limits, from the settings: gRPC core channel arguments."""

from __future__ import annotations

from tfservo.core.settings import ConfigError, Settings

__all__ = ["server_options"]

# Calls in flight on a connection told to go away (max age) get this long to finish.
_AGE_GRACE_MS = 30_000


def server_options(settings: Settings) -> list[tuple[str, int | str]]:
    """Channel arguments for settings' limits, then --grpc-channel-arguments (which win)."""
    options: dict[str, int | str] = {
        "grpc.max_concurrent_streams": settings.grpc_max_concurrent_streams,
        # a connection must finish its handshake as an HTTP request its headers
        "grpc.server_handshake_timeout_ms": round(settings.header_timeout * 1000),
        "grpc.http2.settings_timeout": round(settings.header_timeout * 1000),
    }
    if settings.grpc_max_connection_idle > 0:
        options["grpc.max_connection_idle_ms"] = round(settings.grpc_max_connection_idle * 1000)
    if settings.grpc_max_connection_age > 0:
        options["grpc.max_connection_age_ms"] = round(settings.grpc_max_connection_age * 1000)
        options["grpc.max_connection_age_grace_ms"] = _AGE_GRACE_MS
    options.update(parse_channel_arguments(settings.grpc_channel_arguments))
    return list(options.items())


def parse_channel_arguments(text: str) -> dict[str, int | str]:
    """TF Serving's --grpc_channel_arguments: `name=value,...`; integer values become ints."""
    arguments: dict[str, int | str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, has_value, value = item.partition("=")
        if not has_value or not name.strip():
            raise ConfigError(
                f"--grpc-channel-arguments: {item!r} is not NAME=VALUE; write e.g. grpc.max_connection_age_ms=60000"
            )
        value = value.strip()
        arguments[name.strip()] = int(value) if value.lstrip("-").isdigit() else value
    return arguments
