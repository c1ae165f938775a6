"""Media types, and the container's content conversion for invocations without an inference.py.

Requests in application/json, application/jsonlines, application/jsons or text/csv become a TF
Serving REST request the way the container's tensorflowServing.js builds one; TF Serving's JSON
answer is converted to the first type the Accept header allows. Where the script is broken (exact Content-Type string compare,
CSV split on every comma, JSON detected by regex) this module parses properly instead.
"""

from __future__ import annotations

import codecs
import csv
import functools
import io
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson

from tfservo.codecs import tfs_json as json_codec
from tfservo.codecs.json_arrays import NumericTensor, csv_numbers
from tfservo.codecs.media_types import CONVERTIBLE_TYPES, CSV, JSON, is_json_lines, lookup
from tfservo.codecs.rows import answer_rows
from tfservo.core.errors import InvalidArgument, NotAcceptable, UnsupportedMediaType
from tfservo.models.calls import Answer

__all__ = [
    "REQUEST_TYPES",
    "TFS_REQUEST_KEYS",
    "TFS_RESPONSE_KEYS",
    "csv_instances",
    "csv_records",
    "encode_answer",
    "from_tfs_response",
    "MediaType",
    "merge_instances",
    "negotiate",
    "one_line_json",
    "numeric_csv",
    "parse_accept",
    "parse_content_type",
    "parse_media_types",
    "response_records",
    "to_tfs_request",
]

REQUEST_TYPES = CONVERTIBLE_TYPES  # what invocations without an inference.py decode (and answer)
TFS_REQUEST_KEYS = ("instances", "inputs", "examples")
TFS_RESPONSE_KEYS = ("predictions", "results", "outputs")


# -- media types ------------------------------------------------------------------------------

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_TYPE = re.compile(rf"({_TOKEN})/({_TOKEN})")


@dataclass(frozen=True)
class MediaType:
    """One media type or range: `type/subtype`, its parameters (names lowercased) and q."""

    type: str
    subtype: str
    params: dict[str, str] = field(default_factory=dict, compare=False)
    q: float = 1.0

    @property
    def essence(self) -> str:
        return f"{self.type}/{self.subtype}"

    @property
    def charset(self) -> str | None:
        return self.params.get("charset")

    def matches(self, essence: str) -> bool:
        """Whether this type or range (`*/*`, `text/*`) covers the concrete type `essence`."""
        kind, _, sub = essence.lower().partition("/")
        return self.type in ("*", kind) and self.subtype in ("*", sub)

    @classmethod
    def parse(cls, value: str) -> MediaType:
        """Parse one `type/subtype; name=value` item; ValueError if it is not one."""
        head, *params = _split_unquoted(value, ";")
        head = head.strip()
        if head == "*":  # some clients send a bare "*" for */*
            head = "*/*"
        match = _TYPE.fullmatch(head)
        if match is None:
            raise ValueError(f"{value.strip()!r} is not a media type (type/subtype)")
        parsed: dict[str, str] = {}
        q = 1.0
        for param in params:
            name, _, val = param.partition("=")
            name, val = name.strip().lower(), val.strip()
            if len(val) >= 2 and val[0] == val[-1] == '"':
                val = re.sub(r"\\(.)", r"\1", val[1:-1])
            if name == "q":
                try:
                    q = min(max(float(val), 0.0), 1.0)
                except ValueError:
                    raise ValueError(f"q={val!r} in {value.strip()!r} is not a number") from None
            elif name:
                parsed[name] = val
        return cls(match[1].lower(), match[2].lower(), parsed, q)


@functools.lru_cache(maxsize=256)
def _parsed_media_type(value: str) -> MediaType:
    """`MediaType.parse`, remembered: a server sees the same few Content-Type headers all day."""
    return MediaType.parse(value)


def _split_unquoted(value: str, sep: str) -> list[str]:
    """Split on `sep` outside double-quoted strings (parameter values may be quoted)."""
    parts, start, quoted, i = [], 0, False, 0
    while i < len(value):
        char = value[i]
        if char == "\\" and quoted:
            i += 1
        elif char == '"':
            quoted = not quoted
        elif char == sep and not quoted:
            parts.append(value[start:i])
            start = i + 1
        i += 1
    parts.append(value[start:])
    return parts


def parse_media_types(header: str | None) -> list[MediaType]:
    """An Accept-style list, most preferred first (by q, then order); q=0 and junk items dropped."""
    if not header:
        return []
    types = []
    for item in _split_unquoted(header, ","):
        if item.strip():
            try:
                types.append(MediaType.parse(item))
            except ValueError:
                continue  # one malformed item should not make the whole header unusable
    return sorted((t for t in types if t.q > 0), key=lambda t: -t.q)


def parse_accept(header: str | None) -> list[str]:
    """The Accept header's types (`type/subtype`, lowercased) in preference order; [] if none."""
    return [t.essence for t in parse_media_types(header)]


def parse_content_type(header: str | None) -> MediaType:
    """The request's Content-Type; a missing or malformed one is an UnsupportedMediaType."""
    if not header or not header.strip():
        raise UnsupportedMediaType(
            "Unsupported Media Type: Unknown. The request has no Content-Type header; "
            f"send one of {', '.join(REQUEST_TYPES)}"
        )
    try:
        return _parsed_media_type(header)
    except ValueError as exc:
        raise UnsupportedMediaType(
            f"Unsupported Media Type: {header}. The Content-Type header is malformed ({exc}); "
            f"send one of {', '.join(REQUEST_TYPES)}"
        ) from None


# -- requests ---------------------------------------------------------------------------------


def to_tfs_request(body: bytes, content_type: str | None) -> dict[str, object]:
    """Convert an invocation body to a TF Serving REST request, as the container does.

    The body is parsed once: a JSON body that already is a TF Serving request (top-level
    "instances", "inputs" or "examples") comes back as that document (numeric arrays already
    as arrays), which TF Serving's request rules then judge; anything else comes back as a
    {"instances": [...]} dict.
    """
    media = parse_content_type(content_type)
    spec = lookup(media.essence)
    if spec is None or not spec.converts:
        raise UnsupportedMediaType(
            f"Unsupported Media Type: {content_type}. Without an inference.py, invocations accept "
            f"{', '.join(REQUEST_TYPES)}; to accept other types add code/inference.py with an "
            "input_handler (or handler) that converts them"
        )
    utf8 = (media.charset or "utf-8").lower().replace("_", "-") in ("utf-8", "utf8")
    csv_body = spec.record == "csv"
    if not csv_body and utf8:
        fast = json_codec.parse_numeric(body)  # plain numbers: no need to decode the text first
        if fast is not None:
            return fast
    text, changed = _decode(body, media, content_type or "")
    if csv_body:
        numeric = numeric_csv(text.encode() if changed else body, text)
        return {"instances": numeric if numeric is not None else csv_instances(text)}
    if changed:  # another charset, or a byte order mark: the numbers as UTF-8 without it
        fast = json_codec.parse_numeric(text.encode())
        if fast is not None:
            return fast
    return _json_request(text, content_type or "")


def _decode(body: bytes, media: MediaType, content_type: str) -> tuple[str, bool]:
    """Decode with the Content-Type's charset (default UTF-8); True if the bytes were not UTF-8."""
    charset = media.charset or "utf-8"
    try:
        codec = codecs.lookup(charset)
    except LookupError:
        raise UnsupportedMediaType(
            f"Unsupported charset {charset!r} in the Content-Type header ({content_type}); "
            "send UTF-8 or name a charset Python knows (e.g. utf-8, latin-1)"
        ) from None
    try:
        text = body.decode(codec.name)
    except UnicodeDecodeError as exc:
        line = body.count(b"\n", 0, exc.start) + 1
        raise InvalidArgument(
            f"The request body is not valid {codec.name} (Content-Type {content_type}): "
            f"byte {exc.start} on line {line}: {exc.reason}; encode the body as {codec.name} "
            "or name its real charset in the Content-Type header (e.g. charset=latin-1)"
        ) from None
    changed = codec.name != "utf-8"
    if text.startswith("\ufeff"):  # a byte order mark is not part of the document
        text, changed = text[1:], True
    return text, changed


def _json_request(text: str, content_type: str) -> dict[str, object]:
    """The container's json_request, with real JSON parsing instead of its regexes (a
    request of plain numbers has been read already, see to_tfs_request)."""
    if not text.strip():
        raise InvalidArgument(
            f"The request body is empty (Content-Type {content_type}); "
            'send JSON such as {"instances": [[1.0, 2.0]]}'
        )
    try:
        doc = json_codec.load_json(text)
    except json_codec.JsonSyntaxError as exc:
        # Not one document: JSON lines (the container's is_json_lines), one instance per line.
        return {"instances": _json_lines(text, exc, content_type)}
    if isinstance(doc, dict) and any(key in doc for key in TFS_REQUEST_KEYS):
        return doc
    # generic_json_request: a list of lists is already a list of instances, anything else is one.
    if isinstance(doc, list) and doc and isinstance(doc[0], list):
        return {"instances": doc}
    return {"instances": [doc]}


def _json_lines(text: str, whole: json_codec.JsonSyntaxError, content_type: str) -> list[object]:
    """One instance per non-blank line; a body whose first line is not JSON is reported whole."""
    lines = [(i, line.strip()) for i, line in enumerate(text.split("\n"), 1) if line.strip()]
    if len(lines) < 2:
        raise _invalid_json(whole, content_type, text)
    instances = []
    for number, line in lines:
        try:
            instances.append(json_codec.load_json(line))
        except json_codec.JsonSyntaxError as exc:
            if not instances:  # a multi-line document with a mistake in it, not JSON lines
                raise _invalid_json(whole, content_type, text) from None
            raise InvalidArgument(
                f"Line {number} of the JSON lines request body is not valid JSON: {exc.msg} "
                f"at column {exc.colno}; send one JSON document per line"
            ) from None
    return instances


def _invalid_json(exc: json_codec.JsonSyntaxError, content_type: str, text: str) -> InvalidArgument:
    first = text.lstrip().split("\n", 1)[0]
    csv_hint = (" The body looks like CSV: send it with Content-Type: text/csv."
                if "," in first and not first.startswith(("{", "[", '"')) else "")
    return InvalidArgument(
        f"The request body is not valid JSON (Content-Type {content_type}): {exc.msg} at line "
        f"{exc.lineno}, column {exc.colno}.{csv_hint} Send a TF Serving request "
        '({"instances": [...]}), any JSON value (one instance), or JSON lines (one per line)'
    )


_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")
_QUOTE_START = re.compile(r'[ \t]*"')
_QUOTED = re.compile(r'"([^"]*(?:""[^"]*)*)"')
_UNQUOTED = re.compile(r"[^,\n]*")
_BLANKS = re.compile(r"[ \t]*")


def csv_instances(text: str) -> list[object]:
    """A CSV body as TF Serving instances: one per row, a one-column row as a scalar.

    Unquoted numbers become JSON numbers (ints stay ints), every other field a string; blank
    lines are skipped. The container splits lines on every comma and quotes by the first field
    only; here quoting follows RFC 4180 per field.
    """
    instances = []
    for _, fields in csv_records(text):
        values = [field if quoted else _csv_value(field) for field, quoted in fields]
        instances.append(values[0] if len(values) == 1 else values)
    if not instances:
        raise InvalidArgument(
            "The text/csv request body has no rows; send one instance per line, e.g. 1.0,2.0,5.0"
        )
    return instances


def numeric_csv(raw: bytes, text: str) -> NumericTensor | None:
    """A CSV body of plain numbers (same count on every line, no quotes, no blank lines) as one
    array, read without a Python object per value; None for any other body (csv_instances
    then reads it, and says what is wrong with it). A number here is what JSON calls one,
    a subset of what csv_instances accepts."""
    data = raw.replace(b"\r\n", b"\n").rstrip(b"\n")
    if not data or b'"' in data:
        return None
    first = data.find(b"\n")
    fields = data.count(b",", 0, first if first >= 0 else len(data)) + 1
    rows = data.count(b"\n") + 1
    values = csv_numbers(data, rows, fields)
    if values is None:
        return None
    return NumericTensor(values.reshape((rows,) if fields == 1 else (rows, fields)), lambda: csv_instances(text))


def merge_instances(parts: Sequence[NumericTensor | list[object]]) -> NumericTensor | list[object] | None:
    """The instances of several converted bodies as one list or array, in order; None when they
    cannot form one request (arrays of different shapes)."""
    if not parts:
        return None
    tensors = [p for p in parts if isinstance(p, NumericTensor)]
    if len(tensors) == len(parts):
        tails = {p.values.shape[1:] for p in tensors}
        if len(tails) != 1:
            return None
        values = np.concatenate([p.values for p in tensors])
        return NumericTensor(values, lambda: [v for p in tensors for v in p.as_json()])
    merged: list[object] = []
    for part in parts:
        merged.extend(part.as_json() if isinstance(part, NumericTensor) else part)
    return merged


def _csv_value(field: str) -> object:
    stripped = field.strip()
    if _NUMBER.fullmatch(stripped):
        return int(stripped) if _INTEGER.fullmatch(stripped) else float(stripped)
    return field


def csv_records(text: str) -> Iterator[tuple[int, list[tuple[str, bool]]]]:
    """RFC 4180 records as (line number, [(field, was quoted)]), blank lines skipped.

    Hand-rolled because Python's csv module cannot say which fields were quoted, and a quoted
    "1" must stay a string while an unquoted 1 becomes a number.
    """
    text = text.replace("\r\n", "\n")
    pos, line, end_of_text = 0, 1, len(text)
    while pos < end_of_text:
        start_line = line
        newline = text.find("\n", pos)
        end = end_of_text if newline < 0 else newline
        if text.find('"', pos, end) < 0:  # fast path: no quotes on this line
            fields = [(field, False) for field in text[pos:end].split(",")]
            pos, line = end + 1, line + 1
        else:
            fields, pos, line = _quoted_record(text, pos, line)
        if len(fields) == 1 and not fields[0][1] and not fields[0][0].strip():
            continue
        yield start_line, fields


def _quoted_record(text: str, pos: int, line: int) -> tuple[list[tuple[str, bool]], int, int]:
    """One record that has quotes in it; returns its fields, the next position and line."""
    fields: list[tuple[str, bool]] = []
    while True:
        start = _QUOTE_START.match(text, pos)
        if start:
            quoted = _QUOTED.match(text, start.end() - 1)
            if quoted is None:
                raise InvalidArgument(
                    f"Line {line} of the text/csv request body opens a quoted field (field "
                    f"{len(fields) + 1}) that is never closed; end it with \" and write a quote "
                    'inside a quoted field as ""'
                )
            value = quoted.group(1)
            line += value.count("\n")
            fields.append((value.replace('""', '"'), True))
            pos = _match(_BLANKS, text, quoted.end()).end()
            if pos < len(text) and text[pos] not in ",\n":
                raise InvalidArgument(
                    f"Line {line} of the text/csv request body has {text[pos]!r} after the "
                    f"closing quote of field {len(fields)}; separate fields with commas and "
                    'write a quote inside a quoted field as ""'
                )
        else:
            unquoted = _match(_UNQUOTED, text, pos)
            fields.append((unquoted.group(), False))
            pos = unquoted.end()
        if pos >= len(text):
            return fields, pos, line
        separator = text[pos]
        pos += 1
        if separator == "\n":
            return fields, pos, line + 1


def _match(pattern: re.Pattern[str], text: str, pos: int) -> re.Match[str]:
    """A match of a pattern that matches everywhere (it may match nothing)."""
    found = pattern.match(text, pos)
    assert found is not None
    return found


# -- responses --------------------------------------------------------------------------------


def from_tfs_response(body: bytes, accept: Sequence[str]) -> tuple[bytes, str]:
    """TF Serving's JSON answer as (body, content type) for an Accept list from parse_accept.

    Converted to the first acceptable of application/json (as is), JSON lines (TF Serving's JSON
    on one line, as the SageMaker container answers it), text/csv (one row per record, where the
    container answers JSON: users asked for CSV); nothing acceptable → NotAcceptable (406).
    """
    target = negotiate(accept, CONVERTIBLE_TYPES)
    if target == JSON:
        return body, JSON
    if is_json_lines(target):
        return body.replace(b"\n", b""), target
    doc = json_codec.load_json(body)
    if isinstance(doc, dict) and "error" in doc:
        return body, JSON  # an error stays the JSON error object
    return _csv_rows(response_records(doc)), CSV


def encode_answer(answer: Answer, target: str, *, one_line: bool = False) -> bytes:
    """A model's answer in a negotiated CONVERTIBLE_TYPES type: TF Serving's JSON (`one_line`:
    without its newlines, see one_line_json), JSON lines as the container writes them (that JSON
    on one line: the answer is the one record), or CSV, one row per record, written straight from
    the arrays when they are plain numbers. (A batch transform splits answers per record itself,
    from the arrays: `batch/calls`.)"""
    if target == JSON or is_json_lines(target):
        body = json_codec.encode_answer(answer)
        return body.replace(b"\n", b"") if one_line or target != JSON else body
    rows = answer_rows(answer)
    if rows is None:
        return from_tfs_response(json_codec.encode_answer(answer), [target])[0]
    return b"".join(line + b"\n" for line in rows.csv)


def one_line_json(accept: Sequence[str]) -> bool:
    """Whether TF Serving's JSON is answered without its newlines: the SageMaker container removes
    them when Accept names JSON or JSON lines (only whitespace, but clients compare bytes).
    JSON strings escape their newlines, so removing raw ones never changes a value."""
    return any(essence == JSON or is_json_lines(essence) for essence in accept)


def negotiate(accept: Sequence[str], offered: Sequence[str]) -> str:
    """The first offered type the Accept list allows (its first entry if Accept is empty)."""
    if not accept:
        return offered[0]
    for essence in accept:
        kind, _, sub = essence.partition("/")
        for candidate in offered:
            candidate_kind, _, candidate_sub = candidate.partition("/")
            if kind in ("*", candidate_kind) and sub in ("*", candidate_sub):
                return candidate
    raise NotAcceptable(
        f"Nothing the Accept header allows ({', '.join(accept)}) can be produced; tfservo "
        f"answers {', '.join(offered)} (or */*); an inference.py output_handler can answer others"
    )


def response_records(doc: object) -> list[object]:
    """The per-instance records of a TF Serving answer (predictions, results or outputs)."""
    if not isinstance(doc, dict):
        return [doc]
    for key in TFS_RESPONSE_KEYS:
        if key in doc:
            value = doc[key]
            if isinstance(value, list):
                return value
            columns = value.values() if isinstance(value, dict) else ()
            if columns and all(isinstance(v, list) for v in columns):
                lengths = {len(v) for v in columns}
                if len(lengths) == 1:  # columnar outputs: one list per output, batch first
                    return [{k: v[i] for k, v in value.items()} for i in range(lengths.pop())]
            return [value]
    return [doc]


def _csv_rows(records: Sequence[object]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for record in records:
        writer.writerow([_csv_cell(value) for value in _flatten(record)])
    return out.getvalue().encode()


def _flatten(value: object) -> Iterator[object]:
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flatten(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _flatten(item)
    else:
        yield value


def _csv_cell(value: object) -> str:
    """A JSON value as a CSV cell: numbers as JSON writes them (as the array path does)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return orjson.dumps(value).decode() if math.isfinite(value) else repr(value)
    return str(value)
