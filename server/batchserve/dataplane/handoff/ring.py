"""Allocation in a shared-memory arena: a ring, as requests mostly finish in the order they
arrive.

Blocks are carved at the head and given back in any order; the tail moves past every
returned block at the front. The head goes back to the start as soon as it may once past
the first few MiB, so the arena's pages beyond them are touched only by bursts. A request
that stays long holds the tail, and the ring then fills up behind it: ``allocate`` answers
None and the caller sends that request's bytes inline instead, so nothing waits for space.
"""

from __future__ import annotations

from collections import deque

ALIGNMENT = 64
"""Every block starts on a cache line (and on any element type's alignment)."""
COMPACT_BYTES = 4 << 20
"""The ring wraps early, past this, when its front is free: under steady traffic only
these first pages of the arena are ever touched (and counted as the pod's memory)."""


def aligned(size: int) -> int:
    return (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class Ring:
    """Offsets into ``capacity`` bytes; one owner allocates, frees may come in any order."""

    def __init__(self, capacity: int, compact: int = COMPACT_BYTES) -> None:
        self.capacity = capacity - capacity % ALIGNMENT
        self.compact = min(compact, self.capacity)
        self._blocks: deque[list[int]] = deque()  # [offset, end, live], oldest first
        self._by_offset: dict[int, list[int]] = {}
        self._head = 0  # where the next block starts

    @property
    def in_use(self) -> int:
        """Blocks not yet freed (a freed block behind a live one still takes space)."""
        return len(self._by_offset)

    def allocate(self, size: int) -> int | None:
        """The offset of ``size`` free bytes, or None when the ring has no room for them."""
        size = aligned(max(size, 1))
        if not self._blocks:
            self._head = 0
            return self._carve(0, size) if size <= self.capacity else None
        tail, head = self._blocks[0][0], self._head
        if head > tail:  # not wrapped: free space is [head, capacity) and [0, tail)
            fits_front = size < tail  # strictly: a full ring must not look empty
            if head + size > self.compact and fits_front:
                return self._carve(0, size)  # stay in the first pages while traffic allows
            if head + size <= self.capacity:
                return self._carve(head, size)
            return self._carve(0, size) if fits_front else None
        if head + size < tail:  # wrapped: free space is [head, tail)
            return self._carve(head, size)
        return None

    def _carve(self, offset: int, size: int) -> int:
        block = [offset, offset + size, 1]
        self._blocks.append(block)
        self._by_offset[offset] = block
        self._head = offset + size
        return offset

    def free(self, offset: int) -> None:
        """Give a block back; unknown offsets (already freed) are ignored."""
        block = self._by_offset.pop(offset, None)
        if block is None:
            return
        block[2] = 0
        blocks = self._blocks
        while blocks and not blocks[0][2]:
            blocks.popleft()
