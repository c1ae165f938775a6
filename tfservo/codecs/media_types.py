"""The media-type registry: one entry per media type tfservo knows, for every layer.

An entry says how a body of that type behaves: whether invocations without an inference.py
decode it and can answer in it (`converts`), how one record of it reads for the transform's
filters, join and per-record split (`record`: "json" or "csv"), whether a body is one record per
line (`per_line`: bodies can be joined into one request and its answer split back), and which
file names the transform takes for it. An alias (`alias_of`) behaves exactly as its entry and
keeps its own name where it is echoed back. `/invocations`, Accept negotiation, the transform's
sources, splitting and filters, Beam's `content_type=` and OpenAPI all read this table.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CONVERTIBLE_TYPES",
    "CSV",
    "JSON",
    "CSV_TYPES",
    "JSONLINES",
    "JSONS",
    "JSON_LINES_TYPES",
    "JSON_TYPES",
    "MediaTypeSpec",
    "REGISTRY",
    "X_IMAGE",
    "X_JSONLINES",
    "essence",
    "guess_type",
    "is_json_lines",
    "lookup",
    "record_kind",
]

JSON = "application/json"
JSONLINES = "application/jsonlines"
JSONS = "application/jsons"
X_JSONLINES = "application/x-jsonlines"
CSV = "text/csv"
X_IMAGE = "application/x-image"  # what SageMaker image handlers expect


@dataclass(frozen=True)
class MediaTypeSpec:
    """One media type and how tfservo treats bodies of it."""

    name: str
    converts: bool = False
    record: str | None = None  # "json" | "csv" | None (opaque: one body, one record)
    per_line: bool = False
    extensions: tuple[str, ...] = ()
    alias_of: str | None = None


REGISTRY: tuple[MediaTypeSpec, ...] = (
    MediaTypeSpec(JSON, converts=True, record="json", extensions=(".json",)),
    MediaTypeSpec(JSONLINES, converts=True, record="json", per_line=True, extensions=(".jsonl", ".jsonlines")),
    MediaTypeSpec(JSONS, alias_of=JSONLINES, extensions=(".jsons",)),
    MediaTypeSpec(X_JSONLINES, alias_of=JSONLINES),
    MediaTypeSpec(CSV, converts=True, record="csv", per_line=True, extensions=(".csv",)),
    MediaTypeSpec("image/jpeg", extensions=(".jpg", ".jpeg")),
    MediaTypeSpec("image/png", extensions=(".png",)),
    MediaTypeSpec("image/gif", extensions=(".gif",)),
    MediaTypeSpec("image/bmp", extensions=(".bmp",)),
    MediaTypeSpec("image/webp", extensions=(".webp",)),
    MediaTypeSpec("application/x-npy", extensions=(".npy",)),
    MediaTypeSpec("application/x-tfrecord", extensions=(".tfrecord", ".tfrecords")),
    MediaTypeSpec("application/x-recordio", extensions=(".rec", ".recordio")),
    MediaTypeSpec("text/plain", extensions=(".txt",)),
    MediaTypeSpec(X_IMAGE),
)

_BY_NAME = {spec.name: spec for spec in REGISTRY}
# An alias answers with its entry's behaviour (and keeps its name, which callers echo).
_BEHAVIOUR = {spec.name: _BY_NAME[spec.alias_of] if spec.alias_of else spec for spec in REGISTRY}
_BY_EXTENSION = {ext: spec.name for spec in REGISTRY for ext in spec.extensions}

# Derived lists, in the table's order (the first is what an empty Accept gets).
CONVERTIBLE_TYPES = tuple(name for name, spec in _BEHAVIOUR.items() if spec.converts)
JSON_LINES_TYPES = tuple(name for name, spec in _BEHAVIOUR.items() if spec.record == "json" and spec.per_line)
JSON_TYPES = tuple(name for name, spec in _BEHAVIOUR.items() if spec.record == "json")
CSV_TYPES = tuple(name for name, spec in _BEHAVIOUR.items() if spec.record == "csv")


def essence(content_type: str | None) -> str:
    """`type/subtype` of a Content-Type value, lowercased, parameters dropped ("" for none)."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def lookup(content_type: str | None) -> MediaTypeSpec | None:
    """How bodies of this Content-Type behave (an alias gives its entry), or None if unknown."""
    return _BEHAVIOUR.get(essence(content_type))


def record_kind(content_type: str | None) -> str | None:
    """"json" or "csv" for types whose records filters, join and per-record splits read, else None."""
    spec = lookup(content_type)
    return spec.record if spec is not None else None


def is_json_lines(content_type: str | None) -> bool:
    """One JSON document per line (application/jsonlines and its aliases)."""
    spec = lookup(content_type)
    return spec is not None and spec.record == "json" and spec.per_line


def guess_type(filename: str) -> str | None:
    """The media type the transform takes for a file of this name (by its extension), or None."""
    dot = filename.rfind(".")
    return _BY_EXTENSION.get(filename[dot:].lower()) if dot >= 0 else None
