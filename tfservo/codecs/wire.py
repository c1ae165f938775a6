"""Protocol buffer wire format pieces, for the codecs that write or read protos directly
(tf.Example building, TensorProto fields) because going through message objects costs more."""

from __future__ import annotations

__all__ = ["WIRE_LEN", "field", "key", "read_varint", "varint"]

WIRE_LEN = 2  # wire type of length-delimited fields


def varint(value: int) -> bytes:
    """A non-negative int as a base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at data[pos:], and the position after it."""
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def key(field_number: int, wire_type: int = WIRE_LEN) -> bytes:
    """A field's key (tag)."""
    return varint(field_number << 3 | wire_type)


def field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its key, its length, its bytes."""
    return tag + varint(len(payload)) + payload
