"""Splitting an object into records (Line, RecordIO, TFRecord, None) and packing them into requests.

Records keep their framing in the request body, as SageMaker sends them: a Line record with
its own line ending (`\n`, or `\r\n`, none for a last line without one), RecordIO and TFRecord
records whole, so a request of k records is itself a valid stream of k records.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TypeAlias

from tfservo.core.errors import InvalidArgument

__all__ = [
    "CHUNK_BYTES",
    "CHUNK_RECORDS",
    "blank_test",
    "RECORDIO_MAGIC",
    "excerpt",
    "Item",
    "iter_record_chunks",
    "iter_records",
    "iter_text_blocks",
    "line_chunk",
    "pack",
    "pack_batches",
    "payload",
    "Record",
    "RecordBatch",
    "RecordChunk",
    "RecordError",
    "Wire",
    "where",
]

# What a worker sends another: plain tuples of bytes, ints and strings, which Beam's coder, Ray's
# and Spark's pickles write natively (RecordBatch.wire, ColumnBatch.wire, Request/Answer.wire).
Wire: TypeAlias = tuple[Any, ...]

RECORDIO_MAGIC = 0xCED7230A
_RECORDIO_HEAD = struct.Struct("<II")
_TFRECORD_HEAD = struct.Struct("<QI")
_LENGTH_MASK = (1 << 29) - 1


class RecordError(InvalidArgument):
    """An object cannot be split into records (broken framing, oversized record)."""

    def __init__(self, message: str, where: str = "the object") -> None:
        super().__init__(message)
        self.where = where


@dataclass(frozen=True, slots=True)
class Record:
    """One record of an object: its content, its bytes as framed in the object, where it was."""

    index: int  # 1-based; for Line, the line number (blank lines count)
    data: bytes  # content: a line without its line ending, a TFRecord/RecordIO payload
    framed: bytes  # as framed in the object: a line with its ending, a whole RecordIO/TFRecord record
    offset: int  # byte offset in the (decompressed) object

    @property
    def ending(self) -> bytes:
        """What follows a Line record's content in the object (and in a request): b"\\n", b"\\r\\n" or b""."""
        return self.framed[len(self.data) :] if self.framed is not self.data else b""

    @property
    def blank(self) -> bool:
        return not self.data.strip()


def blank_test(split_type: str) -> Callable[[bytes], bool]:
    """Which records of a split type are kept in the output but not sent: blank lines, an empty
    object; no RecordIO or TFRecord record."""
    return _BLANK.get(split_type, _never_blank)


def _never_blank(record: bytes) -> bool:
    return False


_BLANK: dict[str, Callable[[bytes], bool]] = {"Line": lambda record: not record.strip(), "None": lambda record: not record}


def where(record: Record, split_type: str) -> str:
    """'line 7', 'record 3 (byte 120)' or 'the object' for error messages."""
    if split_type == "Line":
        return f"line {record.index}"
    if split_type == "None":
        return "the object"
    return f"record {record.index} (byte {record.offset})"


def excerpt(data: bytes, limit: int = 160) -> str:
    """A record's content for messages: text when it is text, else its size."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(data)} bytes of binary data>"
    return text if len(text) <= limit else text[:limit] + f"… ({len(data)} bytes)"


def iter_records(stream: BinaryIO, split_type: str, name: str) -> Iterator[Record]:
    """The records of one object, read as a stream; RecordError names the object and byte."""
    if split_type == "None":
        data = stream.read()
        yield Record(1, data, data, 0)
    elif split_type == "Line":
        yield from _lines(stream)
    elif split_type == "TFRecord":
        yield from _tfrecords(stream, name)
    elif split_type == "RecordIO":
        yield from _recordio(stream, name)
    else:
        raise RecordError(f"unknown split type {split_type!r}; use None, Line, RecordIO or TFRecord")


def _lines(stream: BinaryIO) -> Iterator[Record]:
    offset = 0
    for number, framed in enumerate(stream, 1):
        line = framed
        if line.endswith(b"\n"):
            line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
        yield Record(number, line, framed, offset)
        offset += len(framed)


def _read_exact(stream: BinaryIO, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = stream.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _tfrecords(stream: BinaryIO, name: str) -> Iterator[Record]:
    crc = _crc32c()
    offset, index = 0, 0
    while True:
        head = _read_exact(stream, 12)
        if not head:
            return
        index += 1
        if len(head) < 12:
            raise RecordError(
                f"{name} is not a TFRecord file: record {index} at byte {offset} has a truncated "
                f"header ({len(head)} of 12 bytes); check --split-type and --compression-type"
            )
        length, length_crc = _TFRECORD_HEAD.unpack(head)
        if crc and _masked(crc(head[:8])) != length_crc:
            raise RecordError(
                f"{name} is not a TFRecord file: the length of record {index} at byte {offset} fails "
                "its checksum; check --split-type and --compression-type (gzip input needs Gzip)"
            )
        body = _read_exact(stream, length + 4)
        if len(body) < length + 4:
            raise RecordError(
                f"{name}: TFRecord record {index} at byte {offset} claims {length} bytes but the "
                f"object ends after {max(len(body) - 4, 0)}; the file is truncated"
            )
        data = body[:length]
        if crc and _masked(crc(data)) != struct.unpack("<I", body[length:])[0]:
            raise RecordError(f"{name}: TFRecord record {index} at byte {offset} fails its data checksum")
        yield Record(index, data, head + body, offset)
        offset += 12 + length + 4


def _recordio(stream: BinaryIO, name: str) -> Iterator[Record]:
    offset, index = 0, 0
    while True:
        start = offset
        parts: list[bytes] = []
        frames: list[bytes] = []
        while True:
            head = _read_exact(stream, 8)
            if not head and not frames:
                return
            if len(head) < 8:
                raise RecordError(
                    f"{name}: RecordIO record {index + 1} at byte {offset} has a truncated header; "
                    "the file is truncated or not RecordIO (check --split-type)"
                )
            magic, lrec = _RECORDIO_HEAD.unpack(head)
            if magic != RECORDIO_MAGIC:
                raise RecordError(
                    f"{name} is not a RecordIO file: no RecordIO magic number at byte {offset} "
                    f"(record {index + 1}); check --split-type and --compression-type"
                )
            cflag, length = lrec >> 29, lrec & _LENGTH_MASK
            padded = length + (-length % 4)
            body = _read_exact(stream, padded)
            if len(body) < padded:
                raise RecordError(
                    f"{name}: RecordIO record {index + 1} at byte {offset} claims {length} bytes "
                    "but the object ends first; the file is truncated"
                )
            frames.append(head + body)
            parts.append(body[:length])
            offset += 8 + padded
            if cflag in (0, 3):  # a whole record, or the last part of a split one
                break
        index += 1
        # A record split by the writer had the magic number where the parts meet.
        data = struct.pack("<I", RECORDIO_MAGIC).join(parts)
        yield Record(index, data, b"".join(frames), start)


@functools.lru_cache(maxsize=1)
def _crc32c() -> Callable[[bytes], int] | None:
    """google-crc32c's CRC-32C (C speed), or None where it is missing: framing is still checked."""
    try:
        import google_crc32c
    except ImportError:
        return None
    return lambda data: google_crc32c.value(data)


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# -- packing ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Item:
    """A record ready to send: `payload` after the input filter, or None when it is not sent
    (a blank line, or a record the input filter rejected: then `error` says why)."""

    record: Record
    payload: bytes | None
    error: str | None = None


# -- batches of records, as columns ---------------------------------------------------------

CHUNK_BYTES = 1 << 20  # how much of a Line-split object is read and cut into lines at once
CHUNK_RECORDS = 4096  # records of other split types gathered before they are filtered and packed


@dataclass(slots=True)
class RecordBatch:
    """Consecutive records of one object as columns: what one request carries.

    `payloads[i]` is what record i sends (after the input filter), or None when it is not
    sent: a blank line, an empty object, or a record the input filter rejected (then
    `errors[i]` says why). Records that are not sent ride along so the output keeps its place.
    """

    first: int  # index of the first record (1-based; for Line, its line number)
    data: list[bytes]  # each record's content
    payloads: list[bytes | None]
    errors: dict[int, str] = field(default_factory=dict)
    framed: list[bytes] | None = None  # RecordIO/TFRecord: each record with its framing
    offsets: list[int] | None = None  # RecordIO/TFRecord: each record's byte offset
    nbytes: int = 0  # bytes of the (decompressed) object the records span, for progress
    endings: dict[int, bytes] | None = None  # Line: the line endings that are not b"\n", by position

    def __len__(self) -> int:
        return len(self.data)

    def record(self, i: int) -> Record:
        """Record i as a Record (for messages and dead letters)."""
        data = self.data[i]
        if self.framed is not None:
            framed = self.framed[i]
        elif self.endings is not None:
            framed = data + self.endings.get(i, b"\n")
        else:
            framed = data
        return Record(self.first + i, data, framed, self.offsets[i] if self.offsets is not None else 0)

    def body(self) -> bytes:
        """The request body: each sent record's payload, with its own line ending for Line."""
        sent = [p for p in self.payloads if p is not None]
        if self.endings is None:
            return b"".join(sent)
        if not self.endings:
            return b"\n".join(sent) + b"\n" if sent else b""
        ends = self.endings
        return b"".join(p + ends.get(i, b"\n") for i, p in enumerate(self.payloads) if p is not None)

    def sent(self) -> list[int]:
        """Positions of the records that are sent."""
        return [i for i, p in enumerate(self.payloads) if p is not None]

    def items(self) -> list[Item]:
        """The batch as Items (the per-record path's view of it)."""
        return [Item(self.record(i), p, self.errors.get(i)) for i, p in enumerate(self.payloads)]

    def wire(self) -> Wire:
        """Plain tuples of bytes, ints and strings (what Beam's coder writes natively)."""
        return (self.first, self.data, self.payloads, self.errors, self.framed, self.offsets, self.nbytes, self.endings)

    @staticmethod
    def unwire(wire: Wire) -> RecordBatch:
        first, data, payloads, errors, framed, offsets, nbytes, endings = wire
        return RecordBatch(
            first, list(data), list(payloads), dict(errors), framed, offsets, nbytes,
            None if endings is None else dict(endings),
        )


@dataclass(slots=True)
class RecordChunk:
    """Records read from an object, before the input filter: a Line chunk, or gathered records."""

    first: int
    data: list[bytes]
    framed: list[bytes] | None = None
    offsets: list[int] | None = None
    nbytes: int = 0
    endings: dict[int, bytes] | None = None  # Line: endings that are not b"\n", by position


def iter_record_chunks(stream: BinaryIO, split_type: str, name: str) -> Iterator[RecordChunk]:
    """The records of one object in chunks; Line splitting cuts big reads into lines at once."""
    if split_type == "Line":
        yield from _line_chunks(stream)
        return
    chunk = RecordChunk(1, [], [] if split_type in ("RecordIO", "TFRecord") else None, [])
    for record in iter_records(stream, split_type, name):
        chunk.data.append(record.data)
        if chunk.framed is not None:
            chunk.framed.append(record.framed)
        assert chunk.offsets is not None
        chunk.offsets.append(record.offset)
        chunk.nbytes += len(record.framed)
        if len(chunk.data) >= CHUNK_RECORDS:
            yield chunk
            chunk = RecordChunk(record.index + 1, [], [] if chunk.framed is not None else None, [])
    if chunk.data:
        yield chunk


def iter_text_blocks(stream: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """A Line-split object a megabyte at a time, cut after a line ending: (number of the block's
    first line, its text). Every block but an object's last ends with b"\n"."""
    index, pending = 1, []
    while True:
        block = stream.read(CHUNK_BYTES)
        if not block:
            break
        cut = block.rfind(b"\n")
        if cut < 0:
            pending.append(block)
            continue
        text = b"".join([*pending, block[: cut + 1]]) if pending else block[: cut + 1]
        pending = [block[cut + 1 :]] if cut + 1 < len(block) else []
        yield index, text
        index += text.count(b"\n")
    if pending:
        yield index, b"".join(pending)  # no line ending after the last line: kept as it is


def line_chunk(index: int, text: bytes) -> RecordChunk:
    """One text block's lines as `_lines` reads them (a trailing CR is dropped with its LF)."""
    if not text.endswith(b"\n"):
        return RecordChunk(index, [text], nbytes=len(text), endings={0: b""})
    lines = text[:-1].split(b"\n")
    endings: dict[int, bytes] = {}
    if b"\r\n" in text:
        endings = {i: b"\r\n" for i, line in enumerate(lines) if line.endswith(b"\r")}
        lines = [line[:-1] if i in endings else line for i, line in enumerate(lines)]
    return RecordChunk(index, lines, nbytes=len(text), endings=endings)


def _line_chunks(stream: BinaryIO) -> Iterator[RecordChunk]:
    """Lines as `_lines` reads them, a megabyte at a time."""
    for index, text in iter_text_blocks(stream):
        yield line_chunk(index, text)


def pack(
    items: Iterable[Item],
    *,
    split_type: str,
    batch_strategy: str,
    max_bytes: int,
    name: str,
    limit_mb: float | None = None,
) -> Iterator[list[Item]]:
    """Group consecutive items into requests of at most `max_bytes` (MultiRecord) or one
    record each (SingleRecord); items that are not sent ride along with their neighbours.

    A record bigger than `max_bytes` on its own raises RecordError naming it.
    """
    packer = _Packer(batch_strategy, max_bytes)
    line = split_type == "Line"
    batch: list[Item] = []
    for item in items:
        if item.payload is not None:
            size = len(item.payload) + (len(item.record.ending) if line else 0)
            if size > max_bytes:
                raise _too_big(item.record, size, split_type, max_bytes, name, limit_mb)
            if packer.closes(size):
                yield batch
                batch = []
        batch.append(item)
    if batch:
        yield batch


def pack_batches(
    chunks: Iterable[tuple[RecordChunk, list[bytes | None], dict[int, str]]],
    *,
    split_type: str,
    batch_strategy: str,
    max_bytes: int,
    name: str,
    limit_mb: float | None = None,
) -> Iterator[RecordBatch]:
    """`pack` for record chunks with their payloads and filter errors: the same requests,
    as RecordBatches, whichever chunks the records were read in."""
    packer = _Packer(batch_strategy, max_bytes)
    line = split_type == "Line"
    current: RecordBatch | None = None
    for chunk, payloads, errors in chunks:
        endings = chunk.endings or {}
        start = 0
        for i, payload_ in enumerate(payloads):
            if payload_ is None:
                continue
            size = len(payload_) + (len(endings.get(i, b"\n")) if line else 0)
            if size > max_bytes:
                raise _too_big(_chunk_record(chunk, i), size, split_type, max_bytes, name, limit_mb)
            if packer.closes(size):
                current = _extend(current, chunk, payloads, errors, start, i, line)
                assert current is not None
                yield current
                current, start = None, i
        current = _extend(current, chunk, payloads, errors, start, len(payloads), line)
    if current is not None and current.data:
        yield current


def _extend(
    batch: RecordBatch | None,
    chunk: RecordChunk,
    payloads: list[bytes | None],
    errors: dict[int, str],
    start: int,
    end: int,
    line: bool,
) -> RecordBatch | None:
    """`batch` with the chunk's records start..end appended (a new batch if None)."""
    if start >= end:
        return batch
    if batch is None:
        batch = RecordBatch(
            chunk.first + start, [], [], {},
            [] if chunk.framed is not None else None, [] if chunk.offsets else None,
            endings={} if line else None,
        )
    base = len(batch.data)
    batch.data.extend(chunk.data[start:end])
    batch.payloads.extend(payloads[start:end])
    for i, error in errors.items():
        if start <= i < end:
            batch.errors[base + i - start] = error
    if batch.endings is not None and chunk.endings:
        for i, ending in chunk.endings.items():
            if start <= i < end:
                batch.endings[base + i - start] = ending
    if batch.framed is not None and chunk.framed is not None:
        batch.framed.extend(chunk.framed[start:end])
    if batch.offsets is not None and chunk.offsets:
        batch.offsets.extend(chunk.offsets[start:end])
    if chunk.framed is not None:
        batch.nbytes += sum(len(f) for f in chunk.framed[start:end])
    elif start == 0 and end == len(chunk.data):
        batch.nbytes += chunk.nbytes
    else:
        batch.nbytes += sum(len(d) + 1 for d in chunk.data[start:end])
    return batch


def _chunk_record(chunk: RecordChunk, i: int) -> Record:
    offset = chunk.offsets[i] if chunk.offsets else 0
    framed = chunk.framed[i] if chunk.framed is not None else chunk.data[i]
    return Record(chunk.first + i, chunk.data[i], framed, offset)


def _too_big(record: Record, size: int, split_type: str, max_bytes: int, name: str, limit_mb: float | None) -> RecordError:
    at = where(record, split_type)
    limit = f"{limit_mb:g} MB ({max_bytes} bytes)" if limit_mb else _mb(max_bytes)
    return RecordError(
        f"{name}: {at} is {_mb(size)}, over --max-payload {limit}; raise --max-payload or make the record smaller",
        at,
    )


class _Packer:
    """Where requests end: the one packing rule of `pack` and `pack_batches`."""

    def __init__(self, batch_strategy: str, max_bytes: int) -> None:
        self.single = batch_strategy == "SingleRecord"
        self.max_bytes = max_bytes
        self.size = 0
        self.sent = 0

    def closes(self, size: int) -> bool:
        """Whether the request so far ends before a record of `size` bytes; counts it into the next."""
        closes = bool(self.sent) and (self.single or self.size + size > self.max_bytes)
        if closes:
            self.size, self.sent = 0, 0
        self.size += size
        self.sent += 1
        return closes


def payload(batch: list[Item], split_type: str) -> bytes:
    """The request body for the sent items of a batch (Line records with their own endings)."""
    if split_type != "Line":
        return b"".join(item.payload for item in batch if item.payload is not None)
    return b"".join(item.payload + item.record.ending for item in batch if item.payload is not None)


def _mb(size: int) -> str:
    return f"{size / 2**20:.3g} MB ({size} bytes)"
