"""A request body's Content-Encoding, undone once where bodies are read (`read_body`): gzip and
deflate, as tritonclient's `request_compression_algorithm` and curl's `--compressed` clients
send them; identity as it is. Anything else is refused (415) rather than parsed as if plain.
The decompressed body is held to the same --max-request-mb as a plain one, so a small
compressed body cannot expand past what the server would accept (a zip bomb)."""

from __future__ import annotations

import zlib

from tfservo.core.errors import InvalidArgument, PayloadTooLarge, UnsupportedMediaType

__all__ = ["ENCODINGS", "decoded"]

# Content-Encoding → the zlib wbits that reads it (deflate: the zlib wrapper RFC 9110 names,
# or the raw stream some clients send, told apart by the first byte)
ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decoded(body: bytes, encoding: str | None, limit_bytes: int) -> bytes:
    """`body` with its Content-Encoding (`encoding`, as sent) undone."""
    if encoding is None:
        return body
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
    for coding in reversed(codings):  # applied in the order listed: undone last first
        if coding == "identity":
            continue
        wbits = ENCODINGS.get(coding)
        if wbits is None:
            raise UnsupportedMediaType(
                f"Content-Encoding {coding!r} is not supported; send the body as gzip, deflate or identity"
            )
        if coding == "deflate" and body[:1] and (body[0] & 0x0F) != 8:
            wbits = -zlib.MAX_WBITS  # raw deflate, without the zlib header
        body = _inflate(body, wbits, coding, limit_bytes)
    return body


def _inflate(body: bytes, wbits: int, coding: str, limit_bytes: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit_bytes + 1)
    except zlib.error as exc:
        raise InvalidArgument(f"the body is not valid {coding} ({exc}) though Content-Encoding says it is") from None
    if len(out) > limit_bytes:
        raise PayloadTooLarge(
            f"the {coding} body expands past the limit of {limit_bytes} bytes ({limit_bytes / 2**20:g} MB); send "
            "less or start the server with a larger --max-request-mb"
        )
    if not inflater.eof:
        raise InvalidArgument(f"the {coding} body ends before its compressed stream does; send all of it")
    return out
