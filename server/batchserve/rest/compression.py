"""HTTP body compression as Triton's inference route does it: ``Content-Encoding: gzip`` or
``deflate`` request bodies, and responses compressed per ``Accept-Encoding``.

tritonclient's ``request_compression_algorithm`` sends gzip (``gzip.compress``) or
deflate in its zlib wrapping (``zlib.compress``), and ``response_compression_algorithm``
asks for either. A compressed body is untrusted: it is inflated in bounded steps, and
refused with 413 as soon as its inflated size passes the same limit a plain body has,
so a small "zip bomb" never grows past that limit in memory.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Sequence
from typing import Final

from batchserve.core.errors import InvalidArgument, PayloadTooLarge

GZIP: Final = "gzip"
DEFLATE: Final = "deflate"
ACCEPTED: Final = b"gzip, deflate"
"""The Accept-Encoding header sent back with an unsupported Content-Encoding, as Triton."""

_WBITS: Final = {GZIP: 16 + zlib.MAX_WBITS, DEFLATE: zlib.MAX_WBITS}
_STEP: Final = 1 << 20  # inflated bytes produced per step
# Inflating can multiply a body by ~1000, so all but tiny ones inflate in a worker thread;
# answers compress there above 64 KiB, at zlib's fastest level (tensor data compresses
# little at any level, and the time is the client's latency).
INFLATE_OFF_LOOP_ABOVE: Final = 4 << 10
DEFLATE_OFF_LOOP_ABOVE: Final = 64 << 10
DEFLATE_LEVEL: Final = 1
"""Bodies larger than this are (de)compressed in a worker thread, off the event loop."""


class UnsupportedEncoding(InvalidArgument):
    """A Content-Encoding other than gzip, deflate or identity."""


def request_encoding(header: bytes | None) -> str | None:
    """The body's coding, None for identity; anything else is refused, as Triton does."""
    if header is None:
        return None
    value = header.strip().lower()
    if value in (b"", b"identity"):
        return None
    if value == b"gzip":
        return GZIP
    if value == b"deflate":
        return DEFLATE
    shown = value[:40].decode("latin-1")
    raise UnsupportedEncoding(
        f"Unsupported compression type (batchserve: Content-Encoding '{shown}' is not "
        "supported; send gzip, deflate or identity)"
    )


def response_encoding(header: bytes | None) -> str | None:
    """The coding to answer with: of identity, deflate and gzip, the one with the highest
    q-value in ``Accept-Encoding`` (the first on a tie); None for identity. Entries that
    do not parse are skipped, and ``q=0`` never selects a coding."""
    if not header:
        return None
    best, weight = "identity", 0.0
    for entry in header.decode("latin-1").split(","):
        name, _, params = entry.partition(";")
        coding = name.strip().lower()
        if coding not in ("identity", GZIP, DEFLATE):
            continue
        quality = _quality(params)
        if quality is not None and quality > weight:
            best, weight = coding, quality
    return None if best == "identity" else best


def _quality(params: str) -> float | None:
    """The ``q=`` value of one Accept-Encoding entry (1 when absent), None when malformed."""
    params = params.strip()
    if not params:
        return 1.0
    key, _, value = params.partition("=")
    if key.strip().lower() != "q":
        return None
    try:
        quality = float(value.strip())
    except ValueError:
        return None
    return quality if 0.0 <= quality <= 1.0 else None


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """The decompressed body; PayloadTooLarge once it passes ``limit`` bytes, InvalidArgument
    when the data is not a complete stream of that coding. Concatenated gzip members are
    read one after another, as gzip readers do."""
    parts: list[bytes] = []
    size, data = 0, body
    while True:
        inflater = zlib.decompressobj(_WBITS[encoding])
        try:
            while True:
                chunk = inflater.decompress(data, _STEP)
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(
                        f"request body is over the {limit}-byte limit once decompressed "
                        f"({encoding})"
                    )
                parts.append(chunk)
                data = inflater.unconsumed_tail
                # a full step may leave output pending inside zlib even with no input left
                if inflater.eof or (not data and len(chunk) < _STEP):
                    break
        except zlib.error as error:
            raise InvalidArgument(f"request body is not valid {encoding} data: {error}") from None
        if not inflater.eof:
            raise InvalidArgument(f"request body is not valid {encoding} data: it is truncated")
        data = inflater.unused_data
        if not data or encoding != GZIP:
            break
    if data:
        raise InvalidArgument(
            f"request body has {len(data)} bytes after the end of its {encoding} data"
        )
    return parts[0] if len(parts) == 1 else b"".join(parts)


def deflate(chunks: Sequence[bytes | memoryview], encoding: str) -> bytes:
    """The response body compressed with ``encoding`` (gzip, or deflate in zlib's wrapping)."""
    compressor = zlib.compressobj(DEFLATE_LEVEL, wbits=_WBITS[encoding])
    out = [compressor.compress(chunk) for chunk in chunks]
    out.append(compressor.flush())
    return b"".join(out)


async def inflate_async(body: bytes, encoding: str, limit: int) -> bytes:
    """:func:`inflate`, in a worker thread for large bodies so other requests keep moving."""
    if len(body) <= INFLATE_OFF_LOOP_ABOVE:
        return inflate(body, encoding, limit)
    return await asyncio.to_thread(inflate, body, encoding, limit)


async def deflate_async(chunks: Sequence[bytes | memoryview], encoding: str) -> bytes:
    """:func:`deflate`, in a worker thread for large bodies."""
    if sum(len(chunk) for chunk in chunks) <= DEFLATE_OFF_LOOP_ABOVE:
        return deflate(chunks, encoding)
    return await asyncio.to_thread(deflate, chunks, encoding)
