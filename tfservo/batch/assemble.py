"""Splitting one response back into per-record outputs, and assembling an object's output.

A MultiRecord request of n records gets one answer (`{"predictions": [...]}`, JSON lines or
CSV rows); each record gets its own part of it, so the .out keeps one line per input record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from tfservo.codecs.content_types import TFS_RESPONSE_KEYS, csv_records, response_records
from tfservo.codecs.media_types import CSV, JSON, essence, is_json_lines

__all__ = ["assemble_piece", "csv_line", "RecordOutput", "split_response", "SplitError"]

_MISSING = object()
_SPECIAL = re.compile(r'["\r\n]')


class SplitError(ValueError):
    """A response that cannot be divided into one output per record."""


@dataclass(frozen=True, slots=True)
class RecordOutput:
    """One record's output: its text as written (`line`) and, when known, its format and value."""

    line: bytes
    kind: str  # "json", "csv" or "raw"
    value: object = _MISSING  # the parsed JSON value ("json" only)

    @property
    def has_value(self) -> bool:
        return self.value is not _MISSING


def split_response(body: bytes, content_type: str | None, count: int) -> list[RecordOutput]:
    """`count` outputs from one response body; SplitError when it does not hold `count` answers."""
    kind = essence(content_type)
    if is_json_lines(kind):
        lines = [line for line in body.split(b"\n") if line.strip()]
        if len(lines) == 1:  # TF Serving's answer on one line: how the container frames JSON lines
            try:
                doc = orjson.loads(lines[0])
            except orjson.JSONDecodeError:
                doc = None
            if isinstance(doc, dict) and any(key in doc for key in TFS_RESPONSE_KEYS):
                return _split_json(doc, count)
        return _expect(count, [_json_line(line) for line in lines], body, "JSON lines")
    if kind == CSV:
        return _expect(count, _csv_rows(body), body, "CSV rows")
    if kind == JSON or kind.endswith("+json"):
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            if count == 1:
                return [_raw(body)]
            raise SplitError("the answer is not valid JSON, so it cannot be split per record") from None
        return _split_json(doc, count)
    if count == 1:
        return [_raw(body)]
    raise SplitError(
        f"the answer has content type {content_type or 'unknown'}, which cannot be split per record; "
        "answer application/json, application/jsonlines or text/csv, or use --batch-strategy SingleRecord"
    )


def whole_response(body: bytes) -> RecordOutput:
    """A whole object's answer as its one record's output (--split-type None): the answer as it
    is, so an output filter such as `$.predictions[0]` applies to the answer, as in SageMaker."""
    return _raw(body)


def _split_json(doc: object, count: int) -> list[RecordOutput]:
    keyed = isinstance(doc, dict) and any(key in doc for key in TFS_RESPONSE_KEYS)
    if keyed:
        values = response_records(doc)
    elif isinstance(doc, list) and count > 1:
        values = doc
    else:
        values = [doc]
    if count == 1 and len(values) != 1:
        values = [values]  # one record that the model treated as several instances
    if len(values) != count:
        raise SplitError(
            f"the answer holds {len(values)} {'prediction' if len(values) == 1 else 'predictions'} "
            f"for {count} records"
        )
    return [RecordOutput(orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY), "json", v) for v in values]


def _json_line(line: bytes) -> RecordOutput:
    line = line.strip()
    try:
        return RecordOutput(line, "json", orjson.loads(line))
    except orjson.JSONDecodeError:
        return RecordOutput(line, "raw")


def _csv_rows(body: bytes) -> list[RecordOutput]:
    text = body.decode("utf-8", errors="replace")
    if '"' not in text:
        rows = [row.rstrip("\r") for row in text.split("\n")]
        return [RecordOutput(row.encode(), "csv") for row in rows if row.strip()]
    return [
        RecordOutput(csv_line([(value, quoted) for value, quoted in fields]), "csv")
        for _, fields in csv_records(text)
    ]


def _expect(count: int, outputs: list[RecordOutput], body: bytes, what: str) -> list[RecordOutput]:
    if len(outputs) == count:
        return outputs
    if count == 1:
        return [_raw(body)]
    raise SplitError(f"the answer holds {len(outputs)} {what} for {count} records")


def _raw(body: bytes) -> RecordOutput:
    body = body.rstrip(b"\r\n")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return RecordOutput(body, "raw")
    return RecordOutput(orjson.dumps(value), "json", value)  # one line, even if pretty-printed


def csv_line(fields: list[tuple[str, bool]]) -> bytes:
    """Fields (text, was quoted) as one CSV line; quoting kept, and added where needed."""
    if not any(quoted for _, quoted in fields):
        line = ",".join(text for text, _ in fields)
        if line.count(",") == len(fields) - 1 and not _SPECIAL.search(line):
            return line.encode()
    out = []
    for text, quoted in fields:
        if quoted or any(c in text for c in ',"\n\r'):
            out.append('"' + text.replace('"', '""') + '"')
        else:
            out.append(text)
    return ",".join(out).encode()


def assemble_piece(body: bytes, assemble_with: str) -> bytes:
    """A response body as it goes into the .out: with a newline after it for --assemble-with Line."""
    if assemble_with == "Line" and not body.endswith(b"\n"):
        return body + b"\n"
    return body
