"""The arena's ring allocator: blocks in order, frees in any order, no overlap ever."""

from __future__ import annotations

import itertools
import random

import pytest
from batchserve.dataplane.handoff.ring import ALIGNMENT, Ring, aligned


def _overlaps(blocks: dict[int, int]) -> bool:
    spans = sorted(blocks.items())
    return any(a + size > b for (a, size), (b, _) in itertools.pairwise(spans))


def test_blocks_are_aligned_and_consecutive() -> None:
    ring = Ring(1 << 20)
    first, second = ring.allocate(10), ring.allocate(100)
    assert first == 0
    assert second == ALIGNMENT
    assert aligned(100) == 2 * ALIGNMENT


def test_a_full_ring_answers_none_until_its_oldest_block_is_freed() -> None:
    ring = Ring(4 * ALIGNMENT, compact=4 * ALIGNMENT)
    offsets = [ring.allocate(ALIGNMENT) for _ in range(4)]
    assert offsets == [0, 64, 128, 192]
    assert ring.allocate(1) is None
    ring.free(64)  # not the oldest: the tail stays
    assert ring.allocate(1) is None
    ring.free(0)  # the tail moves past both
    assert ring.allocate(ALIGNMENT) == 0
    assert ring.allocate(ALIGNMENT) is None, "the front holds 2 blocks; one is free of the two"


def test_the_ring_goes_back_to_the_front_once_past_its_compact_part() -> None:
    ring = Ring(1 << 20, compact=3 * ALIGNMENT)
    a, b, c = (ring.allocate(ALIGNMENT) for _ in range(3))
    assert (a, b, c) == (0, 64, 128)
    past = ring.allocate(ALIGNMENT)  # the front is taken: past the compact part it goes
    assert past == 192
    ring.free(0)
    ring.free(64)
    assert ring.allocate(ALIGNMENT) == 0  # the front is free again: back to it


def test_an_empty_ring_starts_over_at_zero() -> None:
    ring = Ring(1 << 20)
    offsets = [ring.allocate(1000) for _ in range(5)]
    for offset in offsets:
        assert offset is not None
        ring.free(offset)
    assert ring.in_use == 0
    assert ring.allocate(1) == 0


def test_a_block_larger_than_the_ring_is_refused() -> None:
    assert Ring(1 << 12).allocate((1 << 12) + 1) is None


def test_freeing_twice_or_an_unknown_offset_changes_nothing() -> None:
    ring = Ring(1 << 12)
    offset = ring.allocate(10)
    assert offset is not None
    ring.free(offset)
    ring.free(offset)
    ring.free(12345)
    assert ring.in_use == 0


@pytest.mark.parametrize("seed", range(20))
def test_live_blocks_never_overlap_under_random_traffic(seed: int) -> None:
    rng = random.Random(seed)
    capacity = 64 * 1024
    ring = Ring(capacity, compact=8 * 1024)
    live: dict[int, int] = {}
    refused = 0
    for _ in range(3000):
        if live and rng.random() < 0.5:
            offset = rng.choice(list(live))
            del live[offset]
            ring.free(offset)
            continue
        size = rng.choice((1, 64, 700, 5000, 20000))
        offset = ring.allocate(size)
        if offset is None:
            refused += 1
            continue
        assert offset >= 0
        assert offset + aligned(size) <= capacity
        live[offset] = aligned(size)
        assert not _overlaps(live)
    assert refused < 3000
    for offset in list(live):
        ring.free(offset)
    assert ring.in_use == 0
