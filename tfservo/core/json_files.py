"""The small JSON files settings name (a capture config, a key file), read with one wording of
what went wrong."""

from __future__ import annotations

import orjson

from tfservo.core.settings import ConfigError

__all__ = ["read_json_file"]


def read_json_file(path: str, flag: str) -> object:
    """The JSON document at `path`, or ConfigError naming `flag` and the file."""
    try:
        with open(path, "rb") as f:
            return orjson.loads(f.read())
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot read it ({exc.strerror})") from None
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{flag} {path}: not JSON ({exc})") from None
