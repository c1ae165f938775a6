"""Splitting an object into records (Line, RecordIO, TFRecord, None) and packing them into requests.

RecordIO and TFRecord records keep their framing in the request body, as SageMaker sends
them: a request of k records is itself a valid RecordIO / TFRecord stream of k records.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from tfservo.errors import InvalidArgument

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
    data: bytes  # content: a line without its newline, a TFRecord/RecordIO payload
    framed: bytes  # as it goes into a request body (== data for Line and None)
    offset: int  # byte offset in the (decompressed) object

    @property
    def blank(self) -> bool:
        return not self.data.strip()


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
    for number, line in enumerate(stream, 1):
        size = len(line)
        if line.endswith(b"\n"):
            line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
        yield Record(number, line, line, offset)
        offset += size


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
        start, parts, frames = offset, [], []
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
def _crc32c():
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


def separator(split_type: str) -> bytes:
    """What goes between records in a request body."""
    return b"\n" if split_type == "Line" else b""


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
    sep = len(separator(split_type))
    batch: list[Item] = []
    size, sent = 0, 0
    for item in items:
        if item.payload is None:
            batch.append(item)
            continue
        length = len(item.payload)
        if length > max_bytes:
            at = where(item.record, split_type)
            limit = f"{limit_mb:g} MB ({max_bytes} bytes)" if limit_mb else _mb(max_bytes)
            raise RecordError(
                f"{name}: {at} is {_mb(length)}, over --max-payload {limit}; "
                "raise --max-payload or make the record smaller",
                at,
            )
        extra = length + (sep if sent else 0)
        if sent and (batch_strategy == "SingleRecord" or size + extra > max_bytes):
            yield batch
            batch, size, sent, extra = [], 0, 0, length
        batch.append(item)
        size += extra
        sent += 1
    if batch:
        yield batch


def payload(batch: list[Item], split_type: str) -> bytes:
    """The request body for the sent items of a batch."""
    return separator(split_type).join(item.payload for item in batch if item.payload is not None)


def _mb(size: int) -> str:
    return f"{size / 2**20:.3g} MB ({size} bytes)"
