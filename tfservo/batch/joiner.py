"""--input-filter, --join-source Input and --output-filter on CSV and JSON records.

CSV records are arrays of fields (text kept as written, so `0001` stays `0001`); joining
appends the output's fields. JSON objects get the output under "SageMakerOutput"; other JSON
values become {"SageMakerInput": ..., "SageMakerOutput": ...}, as SageMaker does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from tfservo.batch.assemble import RecordOutput, csv_line
from tfservo.batch.jsonpath import JsonPath, JsonPathError
from tfservo.codecs.content_types import csv_records

__all__ = [
    "DataProcessing",
    "Fields",
    "FilterError",
    "output_fields",
    "output_value",
    "parse_csv",
    "parse_json",
]

Fields = list[tuple[str, bool]]  # (text, was quoted)


class FilterError(ValueError):
    """A filter or join that cannot be applied to one record; the message says why."""


@dataclass(frozen=True)
class DataProcessing:
    """The filters and join of a job, for records of one format ('csv', 'json' or None).

    `prepare` and `finish` work on one record and say exactly what is wrong with it;
    `prepare_many` and `finish_rows` do the same for a whole batch of plain CSV records in
    a few list operations, and decline (None) whenever a record needs the per-record path.
    """

    record_format: str | None
    input_filter: JsonPath | None = None
    output_filter: JsonPath | None = None
    join_input: bool = False

    @property
    def active(self) -> bool:
        return self.input_filter is not None or self.output_filter is not None or self.join_input

    @functools.cached_property
    def pickers(self) -> tuple[Callable[[list[Any]], list[Any]] | None, Callable[[list[Any]], list[Any]] | None]:
        """The input and output filters as field pickers (JsonPath.field_picker), None where a
        filter is not set or is not a list of field indexes."""
        return (
            self.input_filter.field_picker() if self.input_filter is not None else None,
            self.output_filter.field_picker() if self.output_filter is not None else None,
        )

    def prepare_many(self, records: list[bytes], blank: Callable[[bytes], bool]) -> tuple[list[bytes | None], dict[int, str]]:
        """Payloads of a chunk of records (None for blank ones, and for those the input filter
        rejects, with the reason in the errors by position)."""
        if self.input_filter is None:
            return [None if blank(r) else r for r in records], {}
        fast = self._pick_csv(records, blank) if self.record_format == "csv" else None
        if fast is not None:
            return fast, {}
        payloads: list[bytes | None] = []
        errors: dict[int, str] = {}
        for i, record in enumerate(records):
            if blank(record):
                payloads.append(None)
                continue
            try:
                payloads.append(self.prepare(record))
            except FilterError as exc:
                payloads.append(None)
                errors[i] = str(exc)
        return payloads, errors

    def _pick_csv(self, records: list[bytes], blank: Callable[[bytes], bool]) -> list[bytes | None] | None:
        pick = self.pickers[0]
        if pick is None or not _plain_csv(records):
            return None
        try:
            return [None if blank(r) else b",".join(pick(r.split(b","))) for r in records]
        except IndexError:
            return None  # a record without that field: the per-record path says which

    def finish_rows(self, records: list[bytes], rows: list[bytes], csv_rows: list[bytes], kind: str) -> list[bytes] | None:
        """Output lines of sent records whose answers are plain numbers (`rows` as JSON, `csv_rows`
        flattened as CSV; `kind` what the answer was: "json" or "csv"); None → per-record path."""
        if not self.join_input and self.output_filter is None:
            return rows if kind == "json" else csv_rows
        if not (self.record_format == "csv" or (not self.join_input and kind == "csv")):
            return None
        pick = self.pickers[1]
        if self.output_filter is not None and pick is None:
            return None
        if self.join_input and not _plain_csv(records):
            return None
        try:
            if self.join_input and pick is not None:
                return [b",".join(pick(r.split(b",") + o.split(b","))) for r, o in zip(records, csv_rows)]
            if self.join_input:
                return [r + b"," + o for r, o in zip(records, csv_rows)]
            assert pick is not None
            return [b",".join(pick(o.split(b","))) for o in csv_rows]
        except IndexError:
            return None

    def prepare(self, data: bytes) -> bytes:
        """The record as sent to the model: the input filter applied."""
        if self.input_filter is None:
            return data
        if self.record_format == "csv":
            return _write_csv(self._select(self.input_filter, parse_csv(data), "input"))
        value = self._select(self.input_filter, parse_json(data), "input")
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)

    def finish(self, data: bytes, output: RecordOutput) -> bytes:
        """One output line: the output joined with its input record and the output filter applied."""
        if not self.join_input and self.output_filter is None:
            return output.line
        if self.record_format == "csv" or (not self.join_input and output.kind == "csv"):
            joined: object = (parse_csv(data) if self.join_input else []) + output_fields(output)
            if self.output_filter is not None:
                joined = self._select(self.output_filter, joined, "output")
            return _write_csv(joined)
        result = output_value(output)
        if self.join_input:
            record = parse_json(data)
            if isinstance(record, dict):
                result = {**record, "SageMakerOutput": result}
            else:
                result = {"SageMakerInput": record, "SageMakerOutput": result}
        if self.output_filter is not None:
            result = self._select(self.output_filter, result, "output")
        return orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY)

    def _select(self, path: JsonPath, value: object, which: str) -> object:
        try:
            return path.select(value)
        except JsonPathError as exc:
            raise FilterError(f"--{which}-filter {exc}") from None


def _plain_csv(records: list[bytes]) -> bool:
    """Records that split on commas exactly as parse_csv reads them: UTF-8, no quotes, no CR."""
    joined = b"\n".join(records)
    if b'"' in joined or b"\r" in joined:
        return False
    try:
        joined.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def parse_csv(data: bytes) -> Fields:
    """One CSV line as fields, quoting remembered."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FilterError(f"the record is not UTF-8 text (byte {exc.start}); CSV filters need text") from None
    if '"' not in text and "\n" not in text:  # the common case, ten times faster than csv_records
        return [(field, False) for field in text.split(",")]
    rows = list(csv_records(text))
    if not rows:
        return [("", False)]
    if len(rows) > 1:
        raise FilterError("the record holds more than one CSV row")
    return rows[0][1]


def parse_json(data: bytes) -> object:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise FilterError(f"the record is not valid JSON ({exc}); JSON filters need one JSON value per record") from None


def output_fields(output: RecordOutput) -> Fields:
    """The output as CSV fields: a CSV row as is, a JSON value flattened (lists and objects)."""
    if output.kind == "csv":
        return parse_csv(output.line)
    if output.has_value:
        return [(_cell(v), False) for v in _flatten(output.value)]
    return [(output.line.decode("utf-8", errors="replace"), False)]


def output_value(output: RecordOutput) -> object:
    """The output as a JSON value: parsed JSON, a CSV row as a list (numbers as numbers)."""
    if output.has_value:
        return output.value
    if output.kind == "csv":
        values = [text if quoted else _number(text) for text, quoted in parse_csv(output.line)]
        return values[0] if len(values) == 1 else values
    return output.line.decode("utf-8", errors="replace")


def _write_csv(selected: object) -> bytes:
    """A selection from a CSV record (one field or a list of them) as a CSV line."""
    if isinstance(selected, list):
        return csv_line([f if isinstance(f, tuple) else (_cell(f), False) for f in selected])
    if isinstance(selected, tuple):
        return csv_line([selected])
    return csv_line([(_cell(selected), False)])


def _flatten(value: object) -> list[object]:
    if isinstance(value, list):
        return [x for item in value for x in _flatten(item)]
    if isinstance(value, dict):
        return [x for item in value.values() for x in _flatten(item)]
    return [value]


def _cell(value: object) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return orjson.dumps(value).decode()


def _number(text: str) -> object:
    try:
        return orjson.loads(text.strip())
    except orjson.JSONDecodeError:
        return text
