"""API keys with scopes: a JSON file of names, SHA-256 hashes, scopes and (optionally) the
models a key may call, checked in constant time; the file holds no key itself.

    {"keys": [{"name": "ci-bot", "sha256": "9f86…", "scopes": ["invoke", "read"], "models": ["half_plus_ten"]}]}

`tfservo keys new` makes a key, prints it once and adds its hash to the file.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import orjson

from tfservo.auth.watched import WatchedFile
from tfservo.core.errors import Code, InvalidArgument, PermissionDenied, ServingError
from tfservo.core.json_files import read_json_file

__all__ = [
    "SCOPES",
    "ApiKey",
    "KeyRing",
    "NotAllowed",
    "Unauthenticated",
    "add_key",
    "bearer",
    "hash_key",
    "new_key",
    "read_keys",
]

# call models; metadata and docs; load/unload; /metrics; load a multi-model endpoint's models on first
# use (X-Amzn-SageMaker-Target-Model), as SageMaker's multi-model endpoints do beside invoke
SCOPES = ("invoke", "read", "manage", "metrics", "load")
_PREFIX = "tfsk_"


class Unauthenticated(ServingError):
    """No key, or one the file does not hold: 401 (gRPC UNAUTHENTICATED). `missing`: no key at all."""

    code = Code.UNAUTHENTICATED

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


class NotAllowed(PermissionDenied):
    """A known key without the scope or the model the request needs: 403 (PERMISSION_DENIED)."""


@dataclass(frozen=True)
class ApiKey:
    """One key as the file describes it (its hash, never the key)."""

    name: str
    sha256: str
    scopes: frozenset[str]
    models: frozenset[str] | None = None  # None: every model

    def allows(self, scope: str, model: str | None) -> bool:
        return scope in self.scopes and (self.models is None or model is None or model in self.models)


def new_key() -> str:
    """A new random key (256 bits)."""
    return _PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The hex SHA-256 the file stores for `key` (keys are random: no slow hash is needed)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def read_keys(path: str) -> tuple[ApiKey, ...]:
    """The keys of a key file (InvalidArgument naming the file and entry when it cannot be used)."""
    doc = read_json_file(path, "--api-keys")
    entries = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise InvalidArgument(f'--api-keys {path}: expected {{"keys": [{{"name": …, "sha256": …, "scopes": […]}}]}}')
    keys = []
    for i, entry in enumerate(entries):
        where = f"--api-keys {path}: keys[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise InvalidArgument(f"{where} needs a name")
        digest = entry.get("sha256")
        if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise InvalidArgument(f"{where} ({entry['name']}): sha256 must be 64 lowercase hex digits")
        scopes = entry.get("scopes")
        if not isinstance(scopes, list) or not scopes or any(s not in SCOPES for s in scopes):
            raise InvalidArgument(f"{where} ({entry['name']}): scopes must be a list of {', '.join(SCOPES)}")
        models = entry.get("models")
        if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) for m in models)):
            raise InvalidArgument(f"{where} ({entry['name']}): models must be a list of model names")
        keys.append(ApiKey(entry["name"], digest, frozenset(scopes), frozenset(models) if models is not None else None))
    return tuple(keys)


def add_key(path: str, name: str, scopes: Sequence[str], models: Collection[str] | None = None) -> str:
    """A new key for `name`, its hash added to the file at `path` (made if missing); the key is
    returned once and stored nowhere."""
    bad = [s for s in scopes if s not in SCOPES]
    if bad or not scopes:
        raise InvalidArgument(f"scopes must be some of {', '.join(SCOPES)}, not {', '.join(bad) or 'none'}")
    try:
        existing = [
            {"name": k.name, "sha256": k.sha256, "scopes": sorted(k.scopes),
             **({"models": sorted(k.models)} if k.models is not None else {})}
            for k in read_keys(path)
        ]
    except InvalidArgument:
        if os.path.exists(path):
            raise  # a file we cannot read is not ours to overwrite
        existing = []
    key = new_key()
    entry: dict[str, object] = {"name": name, "sha256": hash_key(key), "scopes": list(scopes)}
    if models:
        entry["models"] = sorted(models)
    data = orjson.dumps({"keys": [*existing, entry]}, option=orjson.OPT_INDENT_2) + b"\n"
    temporary = f"{path}.tmp-{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(temporary, path)
    return key


class KeyRing:
    """The keys of one file (re-read when it changes), and the checks requests go through."""

    def __init__(self, path: str) -> None:
        self.file = WatchedFile(path, read_keys, "api keys")

    def authenticate(self, presented: str | None) -> ApiKey:
        """The key a request presented (`Authorization: Bearer …`), or Unauthenticated. Every
        stored hash is compared, in constant time, whatever matches."""
        if not presented:
            raise Unauthenticated("this server needs an API key: send Authorization: Bearer <key>", missing=True)
        digest = hash_key(presented)
        found = None
        for key in self.file.current():
            if hmac.compare_digest(key.sha256, digest):
                found = key
        if found is None:
            raise Unauthenticated("the API key is not valid (unknown, or rotated out)")
        return found

    @staticmethod
    def authorize(key: ApiKey, scope: str, model: str | None) -> None:
        """NotAllowed unless `key` has `scope` (and may call `model`, when one is named)."""
        if scope not in key.scopes:
            raise NotAllowed(f"API key {key.name!r} lacks the {scope!r} scope this request needs")
        if not key.allows(scope, model):
            raise NotAllowed(f"API key {key.name!r} may not call model {model!r}")


def bearer(value: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` value (None when it is not one)."""
    if value is None:
        return None
    kind, _, token = value.strip().partition(" ")
    return token.strip() or None if kind.lower() == "bearer" else None
