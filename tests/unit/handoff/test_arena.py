"""Tensors through an arena: written once, read in place, returned when no view is left."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
from batchserve.core.datatypes import BY_WIRE
from batchserve.dataplane.handoff import descriptors
from batchserve.dataplane.handoff.arena import Arena


@pytest.fixture
def arena() -> Arena:
    return Arena.create("test-arena", 1 << 20)


def _placed(arena: Arena, tensors: list[tuple[str, str, np.ndarray]]) -> list[np.ndarray]:
    block, inline, described = descriptors.place(
        [(name, BY_WIRE[wire], array) for name, wire, array in tensors], arena
    )
    return [descriptors.read(arena, block, inline, d) for d in described]


def test_fixed_size_tensors_round_trip_as_views_of_the_arena(arena: Arena) -> None:
    floats = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ints = np.array([[1, -2], [3, 1 << 40]], dtype=np.int64)
    halves = np.linspace(0, 1, 5, dtype=np.float16)
    read = _placed(arena, [("a", "FP32", floats), ("b", "INT64", ints), ("c", "FP16", halves)])
    for got, sent in zip(read, (floats, ints, halves), strict=True):
        np.testing.assert_array_equal(got, sent)
        assert got.dtype == sent.dtype
    assert not read[0].flags.owndata, "read in place, not copied"
    assert np.shares_memory(read[0], np.frombuffer(arena.map, dtype=np.uint8))


def test_bytes_tensors_round_trip(arena: Arena) -> None:
    words = np.array([b"", b"abc", "é".encode(), b"\x00" * 70], dtype=object)
    (got,) = _placed(arena, [("w", "BYTES", words)])
    assert got.tolist() == words.tolist()


def test_a_non_contiguous_view_is_written_in_order(arena: Arena) -> None:
    whole = np.arange(40, dtype=np.float32).reshape(8, 5)
    (got,) = _placed(arena, [("s", "FP32", whole[::2, 1:4])])
    np.testing.assert_array_equal(got, whole[::2, 1:4])


def test_tensors_go_inline_when_the_arena_is_full() -> None:
    small = Arena.create("small", 4096)
    big = np.ones(2048, dtype=np.float32)  # 8 KiB
    block, inline, described = descriptors.place([("x", BY_WIRE["FP32"], big)], small)
    assert block == descriptors.INLINE
    assert len(inline) == big.nbytes
    np.testing.assert_array_equal(descriptors.read(small, block, inline, described[0]), big)


def test_a_leased_view_returns_its_block_when_the_last_view_of_it_goes(arena: Arena) -> None:
    released: list[int] = []
    arena.write(128, np.arange(6, dtype=np.int32), BY_WIRE["INT32"])
    lease = arena.leased(128, BY_WIRE["INT32"], (2, 3), released.append)
    np.testing.assert_array_equal(lease, np.arange(6).reshape(2, 3))
    view = lease[1:]  # a view of the view keeps the block
    derived = view.reshape(-1)
    del lease, view
    gc.collect()
    assert released == []
    assert derived.tolist() == [3, 4, 5]
    del derived
    gc.collect()
    assert released == [128]


def test_close_unmaps_only_once_no_array_views_the_arena(arena: Arena) -> None:
    (view,) = _placed(arena, [("a", "FP32", np.ones((4, 4), dtype=np.float32))])
    assert not arena.close()  # a batch still reads it: left mapped, and still readable
    assert not arena.map.closed
    np.testing.assert_array_equal(view, np.ones((4, 4), dtype=np.float32))
    del view
    assert arena.close()
    assert arena.map.closed


def _shared_kib() -> int:
    status = Path("/proc/self/status").read_text().splitlines()
    (line,) = [line for line in status if line.startswith("RssShmem:")]
    return int(line.split()[1])


def test_released_memory_goes_back_and_a_view_reads_zeros_not_a_fault() -> None:
    arena = Arena.create("test-arena", 32 << 20)
    (view,) = _placed(arena, [("a", "FP32", np.ones((4 << 20,), dtype=np.float32))])
    assert np.shares_memory(view, np.frombuffer(arena.map, dtype=np.uint8))
    touched = _shared_kib()
    arena.release_memory()
    assert touched - _shared_kib() >= 15 << 10  # its 16 MiB of pages
    assert not view.any()
    del view
    assert arena.close()
