"""Plain CSV records as Arrow columns: a Line-split CSV job cut, filtered, packed and joined a
block at a time, without a Python object per record.

Where a block of lines is plain CSV — UTF-8, no quote, no CR, no blank line, no byte order
mark, the same number of fields on every line, every field the input filter names present,
no line over --max-payload — Arrow's CSV reader keeps it as binary columns of the text as
written: the
input filter selects columns, a request is a run of rows packed by the same rule as
`records.pack_batches`, the answer's values come back as columns (`codecs.rows.answer_columns`)
and --join-source Input and the output filter select columns again. Any other block, and any
request whose answer is not plain numbers or fails, takes the per-record path
(`records.RecordBatch`), which words every error; the output is the same bytes either way.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tfservo.batch.joiner import DataProcessing
from tfservo.batch.records import Record, RecordBatch, RecordChunk, blank_test, line_chunk
from tfservo.codecs.rows import answer_columns
from tfservo.models.calls import Answer

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ColumnBatch", "column_batches", "columns_apply", "finish_columns"]

PackRows = Callable[[Iterable[tuple[RecordChunk, list[bytes | None], dict[int, str]]]], Iterator[RecordBatch]]


def columns_apply(processing: DataProcessing, split_type: str, batch_strategy: str, per_record: bool) -> bool:
    """Whether a job's records can travel as columns: Line-split CSV, MultiRecord requests, one
    output line per record, filters of field indexes only."""
    if processing.record_format != "csv" or split_type != "Line" or batch_strategy != "MultiRecord" or not per_record:
        return False
    pick_in, pick_out = processing.pickers
    return not ((processing.input_filter is not None and pick_in is None)
                or (processing.output_filter is not None and pick_out is None))


@dataclass(slots=True)
class ColumnBatch:
    """One request of plain CSV records: their fields as Arrow columns (text as written)."""

    first: int  # line number of the first record
    table: pa.Table  # one binary column per field (the text as written), one row per record
    payload: list[int]  # the columns the request sends, in order (the input filter applied)
    nbytes: int = 0  # bytes of the object the records span, for progress

    def __len__(self) -> int:
        rows: int = self.table.num_rows
        return rows

    def record(self, i: int) -> Record:
        """Record i (for messages)."""
        data: bytes = _fields(self.table.slice(i, 1).columns)[0].as_py()
        return Record(self.first + i, data, data + b"\n", 0)

    def body(self) -> bytes:
        """The request body: each record's sent fields and a line ending, as the per-record path sends them."""
        return _joined_lines(_fields([self.table.column(i) for i in self.payload]), b"\n")

    def wire(self) -> tuple[object, ...]:
        """Plain bytes, ints and strings (what Beam's coder writes natively): the columns in
        Arrow's IPC stream format."""
        pa = _arrow()[0]
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.table.schema) as stream:
            stream.write_table(self.table)
        return ("c", self.first, sink.getvalue().to_pybytes(), tuple(self.payload), self.nbytes)

    @staticmethod
    def unwire(wire: tuple[Any, ...]) -> ColumnBatch:
        _, first, ipc, payload, nbytes = wire
        table = _arrow()[0].ipc.open_stream(ipc).read_all()
        return ColumnBatch(first, table, list(payload), nbytes)

    def rows(self, processing: DataProcessing) -> RecordBatch:
        """The same records as a RecordBatch, for the per-record path."""
        data: list[bytes] = _fields(self.table.columns).to_pylist()
        payloads, errors = processing.prepare_many(data, blank_test("Line"))
        return RecordBatch(self.first, data, payloads, errors, nbytes=self.nbytes, endings={})


def column_batches(
    blocks: Iterable[tuple[int, bytes]],
    processing: DataProcessing,
    *,
    max_bytes: int,
    pack_rows: PackRows,
) -> Iterator[ColumnBatch | RecordBatch]:
    """An object's requests from its text blocks (`records.iter_text_blocks`): plain blocks as
    columns, packed across blocks up to `max_bytes` of body. From the first block that is not
    plain on, the rest of the object — the request being gathered included — goes through
    `pack_rows` (the per-record packing): every request then holds the records it holds without
    columns, and a failed request's verdict depends on what it holds (core.batch_split)."""
    pending: list[ColumnBatch] = []
    size = 0
    blocks = iter(blocks)

    def as_rows(chunk: RecordChunk) -> tuple[RecordChunk, list[bytes | None], dict[int, str]]:
        payloads, errors = processing.prepare_many(chunk.data, blank_test("Line"))
        return chunk, payloads, errors

    def flush() -> Iterator[ColumnBatch]:
        nonlocal pending, size
        if pending:
            yield _concat(pending)
        pending, size = [], 0

    for index, text in blocks:
        read = _read_block(text, processing, max_bytes)
        if read is None:
            gathered = [RecordChunk(b.first, _fields(b.table.columns).to_pylist(), nbytes=b.nbytes, endings={})
                        for b in pending]
            rest = (line_chunk(i, t) for i, t in itertools.chain([(index, text)], blocks))
            yield from pack_rows(as_rows(chunk) for chunk in itertools.chain(gathered, rest))
            return
        table, payload, sizes, lines = read
        rows, start = table.num_rows, 0
        while start < rows:
            fits = int(np.searchsorted(np.cumsum(sizes[start:]) + size, max_bytes, side="right"))
            end = start + max(fits, 0 if pending else 1)
            if end > start:
                pending.append(ColumnBatch(index + start, table.slice(start, end - start), payload,
                                           int(lines[start:end].sum())))
                size += int(sizes[start:end].sum())
            if end < rows:
                yield from flush()
            start = end
    yield from flush()


def finish_columns(processing: DataProcessing, batch: ColumnBatch, answer: Answer, kind: str, line_end: bytes) -> bytes | None:
    """The batch's output lines from the model's answer, as `DataProcessing.finish_rows` writes
    them; None when the answer is not one plain number row per record (the per-record path then)."""
    plain = not processing.join_input and processing.output_filter is None
    texts = answer_columns(answer, json=plain and kind == "json")
    if texts is None:
        return None
    rows = len(batch)
    outputs = [_tokens(text) for text in texts]
    if any(len(column) != rows for column in outputs):
        return None
    fields = (list(batch.table.columns) if processing.join_input else []) + outputs
    pick = processing.pickers[1]
    if pick is not None:
        try:
            chosen: list[int] = pick(list(range(len(fields))))
        except IndexError:
            return None
        fields = [fields[i] for i in chosen]
    if not fields:
        return line_end * rows
    return _joined_lines(_fields(fields), line_end)


def _read_block(
    text: bytes, processing: DataProcessing, max_bytes: int
) -> tuple[pa.Table, list[int], np.ndarray, np.ndarray] | None:
    """(columns, the columns sent, each record's bytes in a request body, each line's bytes in
    the object) of a plain block, else None."""
    if not text.endswith(b"\n") or b'"' in text or b"\r" in text or text.startswith((b"\n", b"\xef\xbb\xbf")) or b"\n\n" in text:
        return None
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return None  # the per-record path says which record is not text
    pa, pc, csv = _arrow()
    try:
        table = csv.read_csv(
            io.BytesIO(text),
            read_options=csv.ReadOptions(autogenerate_column_names=True, use_threads=False, block_size=len(text) + 1),
            parse_options=csv.ParseOptions(quote_char=False, ignore_empty_lines=False),
            convert_options=csv.ConvertOptions(
                column_types={f"f{i}": pa.binary() for i in range(text.count(b",", 0, text.index(b"\n")) + 1)},
                strings_can_be_null=False,
            ),
        )
    except pa.ArrowInvalid:
        return None  # ragged lines: the per-record path says which
    if table.num_rows != text.count(b"\n"):
        return None
    width = table.num_columns
    if width == 1 and pc.any(pc.match_substring_regex(table.column(0), r"^[ \t\x0b\x0c]*$")).as_py():
        return None  # a blank line is kept but not sent
    pick = processing.pickers[0]
    try:
        payload: list[int] = pick(list(range(width))) if pick is not None else list(range(width))
    except IndexError:
        return None
    if not payload:
        return None
    lengths = [pc.binary_length(column).to_numpy() for column in table.columns]
    sizes = np.asarray(np.sum([lengths[i] for i in payload], axis=0, dtype=np.int64)) + len(payload)  # commas, b"\n"
    if int(sizes.max()) > max_bytes:
        return None  # the per-record path names the record over --max-payload
    return table, payload, sizes, np.asarray(np.sum(lengths, axis=0, dtype=np.int64)) + width


def _concat(parts: list[ColumnBatch]) -> ColumnBatch:
    if len(parts) == 1:
        return parts[0]
    pa = _arrow()[0]
    table = pa.concat_tables([p.table for p in parts])
    return ColumnBatch(parts[0].first, table, parts[0].payload, sum(p.nbytes for p in parts))


def _tokens(text: bytes) -> Any:
    """One answer column's comma-separated tokens as a binary array."""
    pa, pc, _ = _arrow()
    return pc.list_flatten(pc.split_pattern(pa.array([text], pa.binary()), b","))


def _fields(columns: list[Any]) -> Any:
    """Binary columns joined row by row with commas: each row's CSV line."""
    return columns[0] if len(columns) == 1 else _compute().binary_join_element_wise(*columns, b",")


def _joined_lines(values: Any, end: bytes) -> bytes:
    """Every value followed by `end`, as one bytes object."""
    pa, pc, _ = _arrow()
    if hasattr(values, "combine_chunks"):
        values = values.combine_chunks()
    if not len(values):
        return b""
    whole = pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()), values)
    joined: bytes = pc.binary_join(whole, end)[0].as_py()
    return joined + end


def _arrow() -> tuple[Any, Any, Any]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as csv

    return pa, pc, csv


def _compute() -> Any:
    return _arrow()[1]

