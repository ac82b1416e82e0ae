"""Request and response body compression, as Triton's HTTP inference route does it."""

from __future__ import annotations

import gzip
import random
import zlib

import pytest
from batchserve.core.errors import InvalidArgument, PayloadTooLarge
from batchserve.rest.compression import (
    DEFLATE,
    GZIP,
    MAX_GZIP_MEMBERS,
    UnsupportedEncoding,
    deflate,
    inflate,
    request_encoding,
    response_encoding,
)

BODY = b'{"inputs": []}' * 1000


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, None), (b"identity", None), (b"", None), (b"gzip", GZIP), (b" Deflate ", DEFLATE)],
)
def test_request_encodings_triton_reads(header: bytes | None, expected: str | None) -> None:
    assert request_encoding(header) == expected


@pytest.mark.parametrize("header", [b"br", b"gzip, deflate", b"x-gzip"])
def test_other_request_encodings_get_tritons_text(header: bytes) -> None:
    with pytest.raises(UnsupportedEncoding) as info:
        request_encoding(header)
    assert info.value.message.startswith("Unsupported compression type (batchserve: ")
    assert header.decode() in info.value.message


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        (b"", None),
        (b"gzip", GZIP),
        (b"deflate", DEFLATE),
        (b"br", None),  # nothing batchserve speaks: identity
        (b"gzip;q=0.5, deflate;q=0.8", DEFLATE),  # the highest weight wins
        (b"deflate, gzip", DEFLATE),  # a tie goes to the first
        (b"gzip;q=0", None),  # q=0 means "not acceptable"
        (b"identity;q=0.9, gzip;q=0.1", None),
        (b"gzip;q=abc, deflate;q=0.2", DEFLATE),  # a malformed weight skips the entry
        (b"GZIP ; q=1", GZIP),
    ],
)
def test_response_encoding_follows_accept_encoding_weights(
    header: bytes | None, expected: str | None
) -> None:
    assert response_encoding(header) == expected


def test_gzip_and_zlib_deflate_bodies_inflate_as_tritonclient_sends_them() -> None:
    assert inflate(gzip.compress(BODY), GZIP, len(BODY)) == BODY
    assert inflate(zlib.compress(BODY), DEFLATE, len(BODY)) == BODY
    two_members = gzip.compress(BODY[:10]) + gzip.compress(BODY[10:])
    assert inflate(two_members, GZIP, len(BODY)) == BODY


def test_gzip_members_past_the_limit_are_refused() -> None:
    """Each member costs a fresh inflater: 64 MiB of empty ones is 3.4 million."""
    empty = gzip.compress(b"", mtime=0)
    assert len(empty) == 20
    allowed = gzip.compress(BODY) + empty * (MAX_GZIP_MEMBERS - 1)
    assert inflate(allowed, GZIP, len(BODY)) == BODY
    with pytest.raises(InvalidArgument, match=f"more than {MAX_GZIP_MEMBERS} gzip members"):
        inflate(allowed + empty, GZIP, len(BODY))


def _noise(size: int, seed: int) -> bytes:
    """Bytes that do not compress, so a stream's compressed size is about its own."""
    return random.Random(seed).randbytes(size)


def test_streams_larger_than_what_zlib_is_handed_at_once_inflate_whole() -> None:
    """Members of ~150 KiB compressed span several of the pieces handed to zlib, and end
    inside one: each must start exactly where the one before ended."""
    data = [_noise(150_000 + 7 * i, i) for i in range(3)]
    members = b"".join(gzip.compress(part, mtime=0) for part in data)
    assert inflate(members, GZIP, 1 << 20) == b"".join(data)
    assert inflate(zlib.compress(data[0]), DEFLATE, 1 << 20) == data[0]
    with pytest.raises(InvalidArgument, match="truncated"):  # cut inside the second member
        inflate(members[:200_000], GZIP, 1 << 20)
    with pytest.raises(InvalidArgument, match="after the end of its deflate data"):
        inflate(zlib.compress(data[0]) + data[1][:70_000], DEFLATE, 1 << 20)


def test_inflated_size_is_bounded_without_inflating_past_the_limit() -> None:
    bomb = gzip.compress(bytes(512 << 20), compresslevel=9)  # 512 MiB of zeros in ~0.5 MiB
    assert len(bomb) < 1 << 20
    with pytest.raises(PayloadTooLarge, match=r"allowed value of 4096 bytes\. Use --http-max"):
        inflate(bomb, GZIP, 4096)
    # the step size bounds what was inflated: the refusal is near-instant
    with pytest.raises(PayloadTooLarge):
        inflate(zlib.compress(bytes(10 << 20)), DEFLATE, (4 << 20))


def test_a_body_exactly_at_the_limit_passes() -> None:
    payload = bytes(3 << 20)  # several inflate steps
    assert inflate(gzip.compress(payload), GZIP, len(payload)) == payload
    with pytest.raises(PayloadTooLarge):
        inflate(gzip.compress(payload), GZIP, len(payload) - 1)


@pytest.mark.parametrize(
    ("data", "encoding", "problem"),
    [
        (b"not gzip at all", GZIP, "not valid gzip data"),
        (gzip.compress(BODY)[:-10], GZIP, "truncated"),
        (zlib.compress(BODY)[:20], DEFLATE, "truncated"),
        (b"", GZIP, "truncated"),
        (gzip.compress(BODY), DEFLATE, "not valid deflate data"),
        (zlib.compress(BODY) + b"junk", DEFLATE, "4 bytes after the end of its deflate data"),
        (gzip.compress(BODY) + b"junk", GZIP, "not valid gzip data"),
    ],
    # gzip stamps the time into its header: ids the same in every process (pytest-xdist)
    ids=[
        "not-gzip",
        "gzip-cut",
        "deflate-cut",
        "empty",
        "gzip-as-deflate",
        "deflate-junk",
        "gzip-junk",
    ],
)
def test_broken_compressed_bodies_are_invalid_arguments(
    data: bytes, encoding: str, problem: str
) -> None:
    with pytest.raises(InvalidArgument, match=problem) as info:
        inflate(data, encoding, 1 << 20)
    assert not isinstance(info.value, PayloadTooLarge)


def test_responses_compress_to_what_standard_readers_open() -> None:
    chunks = [b'{"outputs": []}', memoryview(b"\x00\x01" * 5000)]
    whole = b"".join(bytes(c) for c in chunks)
    assert gzip.decompress(deflate(chunks, GZIP)) == whole
    assert zlib.decompress(deflate(chunks, DEFLATE)) == whole
