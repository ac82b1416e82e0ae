"""A worker's intake, a word of its request arena that the model-owning process closes."""

from __future__ import annotations

from batchserve.core.intake import Intake
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.intake_word import worker_intake
from batchserve.dataplane.handoff.read_mark import ReadMark

SIZE = 1 << 16


def test_closing_one_mapping_of_the_arena_closes_the_intake_read_through_the_other() -> None:
    worker_arena = Arena.create("intake-word", SIZE)
    owner_arena = Arena(worker_arena.fd, SIZE)  # a second mapping, as the other process's
    seen_by_worker = worker_intake(worker_arena)
    assert seen_by_worker.open
    worker_intake(owner_arena).close()
    assert not seen_by_worker.open


def test_the_intake_word_leaves_the_read_count_and_the_flag_alone() -> None:
    arena = Arena.create("intake-word", SIZE)
    mark = ReadMark(arena)
    mark.advance(5)
    assert not mark.hold(5)
    worker_intake(arena).close()
    assert mark.read == 5
    assert not mark.hold(5), "a closed intake is not a raised flag or a moved count"
    mark.advance(1)
    assert not worker_intake(arena).open, "a count moving does not reopen the intake"


def test_an_intake_of_its_own_closes_for_good_and_alone() -> None:
    first, second = Intake(), Intake()
    first.close()
    first.close()
    assert not first.open
    assert second.open
