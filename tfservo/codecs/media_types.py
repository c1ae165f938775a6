"""The media types tfservo reads and writes, and their lists: one definition for every layer."""

from __future__ import annotations

__all__ = [
    "CSV",
    "JSON",
    "JSONLINES",
    "JSONS",
    "JSON_LINES_TYPES",
    "JSON_TYPES",
    "X_IMAGE",
    "X_JSONLINES",
    "essence",
]

JSON = "application/json"
JSONLINES = "application/jsonlines"
JSONS = "application/jsons"
X_JSONLINES = "application/x-jsonlines"
CSV = "text/csv"
X_IMAGE = "application/x-image"  # what SageMaker image handlers expect

JSON_LINES_TYPES = (JSONLINES, JSONS, X_JSONLINES)  # one JSON document per line
JSON_TYPES = (JSON, *JSON_LINES_TYPES)


def essence(content_type: str | None) -> str:
    """`type/subtype` of a Content-Type value, lowercased, parameters dropped ("" for none)."""
    return (content_type or "").split(";", 1)[0].strip().lower()
