"""Parse and validate the X-Amzn-SageMaker-Custom-Attributes header.

The container reads `tfs-model-name`, `tfs-model-version` and `tfs-method` with the regex
`tfs-[a-z-]+=[^,]+`: items end at a comma, and a value containing `=` is dropped (njs) or
crashes the request (python_service). Here items are separated by `,` or `;`, a value may
contain `=`, and the three values are validated so a bad one is a 400 that names it, not a
404 from an odd TF Serving URL.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from tfservo.core.errors import InvalidArgument
from tfservo.models.calls import METHODS

__all__ = ["HEADER", "CustomAttributes", "parse_custom_attributes", "requested_model"]

HEADER = "X-Amzn-SageMaker-Custom-Attributes"
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ITEM_SEPARATOR = re.compile(r"[,;]")


@dataclass(frozen=True)
class CustomAttributes:
    """The tfs-* values of the header (None when absent), the raw header, and everything else."""

    model_name: str | None = None
    model_version: str | None = None
    method: str | None = None
    raw: str | None = None
    extras: dict[str, str] = field(default_factory=dict)

    @property
    def version_number(self) -> int | None:
        return int(self.model_version) if self.model_version is not None else None


def parse_custom_attributes(header: str | None) -> CustomAttributes:
    """Parse `tfs-model-name=NAME,tfs-model-version=N,tfs-method=predict` plus any other items.

    Keys are matched case-insensitively; an empty tfs-* value counts as absent (as in the
    container); the last of repeated keys wins. Non-tfs items and unknown tfs-* items go to
    `extras` (an item without `=` maps to "").
    """
    if not header:
        return CustomAttributes(raw=header)
    known: dict[str, str] = {}
    extras: dict[str, str] = {}
    for item in _ITEM_SEPARATOR.split(header):
        key, _, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not key:
            continue
        lowered = key.lower()
        if lowered in ("tfs-model-name", "tfs-model-version", "tfs-method"):
            if value:
                known[lowered] = value
        else:
            extras[key] = value
    name = known.get("tfs-model-name")
    version = known.get("tfs-model-version")
    method = known.get("tfs-method")
    if name is not None and (not _MODEL_NAME.fullmatch(name) or ".." in name):
        raise InvalidArgument(
            f"tfs-model-name={name!r} in the {HEADER} header is not a model name; use the "
            "model directory's name (letters, digits, '.', '_', '-'; no slashes or '..')"
        )
    if version is not None and not (version.isascii() and version.isdigit()):
        raise InvalidArgument(
            f"tfs-model-version={version!r} in the {HEADER} header is not a version number; "
            "use a version directory's name, e.g. tfs-model-version=1"
        )
    if method is not None and method not in METHODS:
        raise InvalidArgument(
            f"tfs-method={method!r} in the {HEADER} header is not one of "
            f"{', '.join(METHODS)}; e.g. tfs-method=predict"
        )
    return CustomAttributes(name, version, method, header, extras)


def requested_model(explicit: str | None, attrs: CustomAttributes, default: Callable[[], str | None]) -> str | None:
    """The model a call is for, decided here for every door and mode: the one it names outright
    (a URL, /models/{name}/invoke, model_name=), else tfs-model-name in its custom attributes,
    else the server's default model (`default`: ModelService.default_model; a remote caller, who
    cannot know it, passes `lambda: None`)."""
    return explicit or attrs.model_name or default()
