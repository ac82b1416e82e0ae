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

from batchserve.core.errors import InvalidArgument
from batchserve.rest.bodies import inflated_too_large

GZIP: Final = "gzip"
DEFLATE: Final = "deflate"
ACCEPTED: Final = b"gzip, deflate"
"""The Accept-Encoding header sent back with an unsupported Content-Encoding, as Triton."""

_WBITS: Final = {GZIP: 16 + zlib.MAX_WBITS, DEFLATE: zlib.MAX_WBITS}
_STEP: Final = 1 << 20  # inflated bytes produced per step
_PIECE: Final = 64 << 10  # compressed bytes handed to zlib per step
MAX_GZIP_MEMBERS: Final = 1024
"""Concatenated gzip members one body may hold. Each costs a fresh inflater: 64 MiB of empty
20-byte members would be 3.4 million of them. BGZF, the blocked gzip of genomics tools, puts
one member in each 64 KiB of data, 1024 in 64 MiB."""
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
    read one after another, as gzip readers do, up to MAX_GZIP_MEMBERS."""
    view = memoryview(body)
    parts: list[bytes] = []
    start, size, members = 0, 0, 0
    while True:
        members += 1
        if members > MAX_GZIP_MEMBERS:
            raise InvalidArgument(
                f"request body is not valid {encoding} data: it has more than "
                f"{MAX_GZIP_MEMBERS} gzip members"
            )
        start, size = _inflate_stream(view, start, encoding, (size, limit), parts)
        if start == len(view) or encoding != GZIP:
            break
    if start < len(view):
        raise InvalidArgument(
            f"request body has {len(view) - start} bytes after the end of its {encoding} data"
        )
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _inflate_stream(
    view: memoryview, start: int, encoding: str, size_limit: tuple[int, int], parts: list[bytes]
) -> tuple[int, int]:
    """Inflate the one stream (gzip member) at ``view[start:]`` onto ``parts``, whose bytes
    are ``size`` of the ``limit``: where the stream ends, and the size then.

    zlib copies the input left over at a stream's end (``unused_data``) and past an output
    step (``unconsumed_tail``): handed the rest of the body each time, a body of many small
    members was copied once per member (4 MiB of empty ones held a core for 15 s). Handed
    ``_PIECE`` bytes at a time, it copies one piece at most.
    """
    inflater = zlib.decompressobj(_WBITS[encoding])
    size, limit = size_limit
    position = start
    try:
        while not inflater.eof:
            piece = view[position : position + _PIECE]
            chunk = inflater.decompress(piece, _STEP)
            position += len(piece) - len(inflater.unconsumed_tail) - len(inflater.unused_data)
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise inflated_too_large(limit)
                parts.append(chunk)
            elif not piece:  # no input left and no output pending
                raise InvalidArgument(f"request body is not valid {encoding} data: it is truncated")
    except zlib.error as error:
        raise InvalidArgument(f"request body is not valid {encoding} data: {error}") from None
    return position, size


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
