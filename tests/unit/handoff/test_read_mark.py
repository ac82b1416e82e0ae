"""The count of read request frames and the worker's flag, shared through the request
arena's control line as two processes map it."""

from __future__ import annotations

import numpy as np
from batchserve.core.datatypes import BY_WIRE
from batchserve.dataplane.handoff import descriptors
from batchserve.dataplane.handoff.arena import CONTROL_BYTES, Arena
from batchserve.dataplane.handoff.read_mark import HOLDING, READ, ReadMark

SIZE = 1 << 16


def _two_sides() -> tuple[Arena, ReadMark, ReadMark]:
    """The worker's mapping and the model-owning process's, of one memfd."""
    worker_arena = Arena.create("read-mark", SIZE)
    owner_arena = Arena(worker_arena.fd, SIZE)
    return worker_arena, ReadMark(worker_arena), ReadMark(owner_arena)


def test_a_worker_with_every_frame_read_holds_nothing_and_raises_no_flag() -> None:
    arena, worker, owner = _two_sides()
    assert not owner.advance(2), "nothing held: no frame owed"
    assert owner.read == worker.read == 2
    assert not worker.hold(2)
    assert arena.control[HOLDING] == 0


def test_the_flag_is_owed_once_and_raised_again_while_frames_are_unread() -> None:
    arena, worker, owner = _two_sides()
    assert worker.hold(3), "three sent, none read: hold"
    assert owner.advance(1), "the worker holds: it is owed a k"
    assert arena.control[HOLDING] == 0, "owed once: the flag is down"
    assert not owner.advance(1), "the flag is down until the worker raises it again"
    assert worker.hold(3), "one of three still unread"
    assert owner.advance(1)
    assert not worker.hold(3), "all three read"
    assert arena.control[HOLDING] == 0


def test_the_control_line_lies_outside_the_ring() -> None:
    arena = Arena.create("control-line", SIZE)
    arena.control[READ] = (1 << 64) - 1
    big = np.zeros((SIZE - CONTROL_BYTES) // 4, np.float32)
    block, _, _ = descriptors.place([("x", BY_WIRE["FP32"], big)], arena)
    assert block == 0, "the ring still takes a tensor filling all but the control line"
    assert arena.control[READ] == (1 << 64) - 1, "the tensor left the control line alone"
    too_big = np.zeros((SIZE - CONTROL_BYTES) // 4 + 1, np.float32)
    assert descriptors.place([("x", BY_WIRE["FP32"], too_big)], Arena.create("c2", SIZE))[0] == (
        descriptors.INLINE
    )


def test_an_arena_still_named_by_a_read_mark_closes() -> None:
    """A link keeps its mark after its worker is gone; the arena must unmap regardless."""
    arena, worker, _ = _two_sides()
    assert worker.hold(1)
    assert arena.close()
