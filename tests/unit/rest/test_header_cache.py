"""Repeated JSON headers of binary requests: decoded once, then only viewed."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.rest import codec, header_cache
from batchserve.rest.header_cache import MAX_HEADER_BYTES, HeaderCache
from decoding import assert_same_request, count_full_decodes


def _binary(arrays: dict[str, np.ndarray], **extra: Any) -> tuple[bytes, int]:
    header = orjson.dumps({
        "inputs": [
            {"name": name, "datatype": "FP32" if a.dtype == np.float32 else "INT64",
             "shape": list(a.shape), "parameters": {"binary_data_size": a.nbytes}}
            for name, a in arrays.items()
        ],
        **extra,
    })  # fmt: skip
    return header + b"".join(a.tobytes() for a in arrays.values()), len(header)


@pytest.fixture
def full_decodes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    return count_full_decodes(monkeypatch, header_cache)


def test_a_repeated_header_decodes_as_the_full_decoder_would(full_decodes: list[bytes]) -> None:
    cache = HeaderCache()
    extra = {
        "id": "r1",
        "parameters": {"priority": 2, "timeout": 5000, "binary_data_output": True, "k": "v"},
        "outputs": [{"name": "y", "parameters": {"binary_data": False}}],
    }
    rng = np.random.default_rng(0)
    for _ in range(3):  # new values, same header
        arrays = {"x": rng.random((2, 4), dtype=np.float32),
                  "n": rng.integers(0, 9, (2, 3)).astype(np.int64)}  # fmt: skip
        body, length = _binary(arrays, **extra)
        got = cache.decode(body, length, "m", "1")
        assert_same_request(got, codec.decode_infer_request(body, length, "m", "1"))
        np.testing.assert_array_equal(got.inputs[0].data, arrays["x"])
        np.testing.assert_array_equal(got.inputs[1].data, arrays["n"])
        assert got.layout == ("m", "1", body[:length], len(body))
    assert len(full_decodes) == 1


def test_requests_do_not_share_what_they_may_change(full_decodes: list[bytes]) -> None:
    cache = HeaderCache()
    body, length = _binary({"x": np.ones((1, 4), np.float32)}, parameters={"k": "v"})
    first = cache.decode(body, length, "m", "")
    first.parameters["k"] = "changed"
    first.inputs.clear()
    again = cache.decode(body, length, "m", "")
    assert again.parameters == {"k": "v"}
    assert len(again.inputs) == 1


def test_the_cache_holds_no_request_bytes() -> None:
    cache = HeaderCache()
    body, length = _binary({"x": np.ones((1, 4), np.float32)})
    cache.decode(body, length, "m", "")
    decoded = cache._layouts.get(("m", "", body[:length], len(body)))
    assert decoded is not None
    assert decoded.template.inputs == []


def test_each_model_and_body_length_is_its_own_entry(full_decodes: list[bytes]) -> None:
    cache = HeaderCache()
    body, length = _binary({"x": np.ones((1, 4), np.float32)})
    cache.decode(body, length, "a", "")
    cache.decode(body, length, "b", "")
    assert cache.decode(body, length, "b", "").model_name == "b"
    assert len(full_decodes) == 2
    with pytest.raises(InvalidArgument, match="runs past the end of the body"):
        cache.decode(body[:-1], length, "a", "")
    with pytest.raises(InvalidArgument, match="left over after the last binary input"):
        cache.decode(body + b"\0", length, "a", "")


def test_malformed_requests_are_never_remembered(full_decodes: list[bytes]) -> None:
    cache = HeaderCache()
    header = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4]}]}'
    for _ in range(2):
        with pytest.raises(InvalidArgument, match="needs 'data' or a binary_data_size"):
            cache.decode(header + bytes(16), len(header), "m", "")
    assert len(full_decodes) == 2
    assert len(cache) == 0


@pytest.mark.parametrize(
    "inputs",
    [
        [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}],
        [{"name": "s", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}],
    ],
    ids=["json-data", "bytes"],
)
def test_inputs_that_are_not_plain_binary_take_the_full_decoder(
    full_decodes: list[bytes], inputs: list[dict[str, Any]]
) -> None:
    cache = HeaderCache()
    header = orjson.dumps({"inputs": inputs})
    tail = b"\2\0\0\0hi" if inputs[0]["datatype"] == "BYTES" else b""
    for _ in range(2):
        request = cache.decode(header + tail, len(header), "m", "")
        assert request.layout is None
    assert len(full_decodes) == 2


def test_json_bodies_and_long_headers_are_not_kept(full_decodes: list[bytes]) -> None:
    cache = HeaderCache()
    json_body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1],
                                          "data": [1]}]})  # fmt: skip
    cache.decode(json_body, None, "m", "")
    long_id = "i" * MAX_HEADER_BYTES
    body, length = _binary({"x": np.ones((1, 4), np.float32)}, id=long_id)
    assert cache.decode(body, length, "m", "").id == long_id
    assert len(cache) == 0


def test_headers_kept_are_bounded(full_decodes: list[bytes]) -> None:
    cache = HeaderCache(entries=2)
    for i in range(5):
        body, length = _binary({"x": np.ones((1, 4), np.float32)}, id=str(i))
        cache.decode(body, length, "m", "")
    assert len(cache) == 2
