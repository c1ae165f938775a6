"""An answer's records as JSON text, straight from its arrays.

Where every output of a row-format prediction (or every regression value) is a finite
number, each record's values are written by one orjson call per output over the whole batch
and cut apart, never turned into Python objects; the numbers read exactly as in TF Serving's
JSON answer. `answer_rows` gives None for anything else (strings, NaN, columnar answers,
classifications), and callers then take the general path through TF Serving's JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

from tfservo.models.calls import Answer, Prediction, Regression

__all__ = ["AnswerRows", "answer_columns", "answer_rows"]

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


@dataclass(frozen=True, slots=True)
class AnswerRows:
    """Per record, the JSON of its value and its values flattened as CSV text.

    `json[i]` is what TF Serving's answer holds for record i (a number, a nested list, or an
    object keyed by output name); `csv[i]` is the same numbers, flattened and comma-separated
    (outputs in name order), as one CSV row.
    """

    json: list[bytes]
    csv: list[bytes]

    def __len__(self) -> int:
        return len(self.json)


def _numeric_outputs(answer: Answer) -> tuple[list[str], list[np.ndarray]] | None:
    """(names, arrays) of an answer whose records are all plain finite numbers, batch first, in
    name order (a regression's values as one unnamed float output); None for anything else."""
    if isinstance(answer, Regression):
        values = np.asarray(answer.results, dtype=np.float32)  # TF Serving writes them as float
        return ([""], [values]) if values.ndim == 1 and np.isfinite(values).all() else None
    if not isinstance(answer, Prediction) or not answer.row_format or not answer.outputs:
        return None
    names = sorted(answer.outputs)
    arrays = [np.asarray(answer.outputs[name]) for name in names]
    batch = None
    for arr in arrays:
        if arr.dtype.kind not in "biuf" or not arr.dtype.isnative or arr.ndim == 0:
            return None
        if batch is not None and arr.shape[0] != batch:
            return None
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            return None
        batch = arr.shape[0]
    return names, arrays


def answer_columns(answer: Answer, *, json: bool = False) -> list[bytes] | None:
    """The records' CSV fields by column: for each flattened value (outputs in name order, as in
    `AnswerRows.csv`), its tokens for every record, comma-separated; None when `answer_rows`
    would be None. A column of n records holds exactly n tokens (numbers never hold commas).
    With `json`, None too unless the columns also read as the records' JSON (`AnswerRows.json`):
    one output of one number per record."""
    found = _numeric_outputs(answer)
    if found is None or (json and (len(found[1]) != 1 or found[1][0].ndim != 1)):
        return None
    columns: list[bytes] = []
    for arr in found[1]:
        flat = arr.reshape(arr.shape[0], -1)
        if flat.shape[0] == 0 or flat.shape[1] == 0:
            return None
        columns.extend(orjson.dumps(np.ascontiguousarray(flat[:, j]), option=_NUMPY)[1:-1] for j in range(flat.shape[1]))
    return columns


def answer_rows(answer: Answer) -> AnswerRows | None:
    """The records of `answer` as text, or None when they are not all plain finite numbers."""
    found = _numeric_outputs(answer)
    if found is None:
        return None
    names, arrays = found
    if isinstance(answer, Regression):
        tokens = _tokens(arrays[0])
        return AnswerRows(tokens, tokens)
    columns = [_output_rows(arr) for arr in arrays]
    if any(c is None for c in columns):
        return None
    if len(columns) == 1:
        json_rows, csv_rows = columns[0]  # type: ignore[misc]
        return AnswerRows(json_rows, csv_rows)
    keys = [orjson.dumps(name) + b":" for name in names]
    json_rows = [
        b"{" + b",".join(key + value for key, value in zip(keys, row)) + b"}"
        for row in zip(*(c[0] for c in columns))  # type: ignore[index]
    ]
    csv_rows = [b",".join(row) for row in zip(*(c[1] for c in columns))]  # type: ignore[index]
    return AnswerRows(json_rows, csv_rows)


def _output_rows(arr: np.ndarray) -> tuple[list[bytes], list[bytes]] | None:
    """(JSON per row, flattened CSV per row) of one output, batch first."""
    if arr.ndim == 1:
        tokens = _tokens(arr)
        return tokens, tokens
    rows = arr.shape[0]
    flat = arr.reshape(rows, -1)
    if rows == 0:
        return [], []
    if flat.shape[1] == 0:
        return None  # rows with no values: left to the general path
    text = orjson.dumps(np.ascontiguousarray(flat), option=_NUMPY)
    csv_rows = text[2:-2].split(b"],[")
    if arr.ndim == 2:
        return [b"[" + row + b"]" for row in csv_rows], csv_rows
    return [orjson.dumps(np.ascontiguousarray(row), option=_NUMPY) for row in arr], csv_rows


def _tokens(values: np.ndarray) -> list[bytes]:
    """One JSON token per element of a 1-D numeric array."""
    if values.size == 0:
        return []
    return orjson.dumps(np.ascontiguousarray(values), option=_NUMPY)[1:-1].split(b",")
