"""Triton's example decoupled backends, as their sources define them: ``repeat`` answers
each element of IN after its DELAY, ``square`` answers N times for N; both end with a bare
final flag."""

from __future__ import annotations

import time

import numpy as np
import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.scheduler.example_responders import RepeatResponder, SquareResponder
from batchserve.scheduler.responders import Reply

pytestmark = pytest.mark.anyio


def _repeat(values: list[int], delays: list[int]) -> dict[str, np.ndarray]:
    return {"IN": np.array(values, np.int32), "DELAY": np.array(delays, np.uint32),
            "WAIT": np.array([1], np.uint32)}  # fmt: skip


async def _all(replies: object) -> list[Reply]:
    return [reply async for reply in replies]  # type: ignore[attr-defined]


async def test_repeat_answers_each_element_after_its_delay_then_a_bare_final() -> None:
    responder = RepeatResponder()
    started = time.monotonic()
    replies = await _all(responder.replies(_repeat([4, 2, 0, 1], [10, 20, 30, 40]), None))
    assert time.monotonic() - started >= 0.1  # the delays add up
    assert [r.outputs["OUT"].tolist() for r in replies[:4]] == [[4], [2], [0], [1]]
    assert [r.outputs["IDX"].tolist() for r in replies[:4]] == [[0], [1], [2], [3]]
    assert [r.final for r in replies] == [False] * 4 + [True]
    assert replies[4].outputs == {}
    assert responder.active == 0


async def test_repeat_refuses_mismatched_shapes_in_the_original_s_words() -> None:
    with pytest.raises(InvalidArgument, match=r"got \[2\] and \[1\]"):
        await _all(RepeatResponder().replies(_repeat([1, 2], [1]), None))


async def test_repeat_stops_once_its_client_has_gone() -> None:
    gone = [False]
    replies = RepeatResponder().replies(_repeat([1, 2, 3], [1, 1, 1]), lambda: gone[0])
    assert (await anext(replies)).outputs["OUT"].tolist() == [1]
    gone[0] = True
    assert await _all(replies) == []


@pytest.mark.parametrize("count", [3, 0])
async def test_square_answers_n_times_with_n(count: int) -> None:
    replies = await _all(SquareResponder().replies({"IN": np.array([count], np.int32)}, None))
    assert [r.outputs["OUT"].tolist() for r in replies[:-1]] == [[count]] * count
    assert replies[-1] == Reply(final=True)


async def test_square_refuses_a_negative_count() -> None:
    with pytest.raises(InvalidArgument, match="input 'IN'"):
        await _all(SquareResponder().replies({"IN": np.array([-1], np.int32)}, None))
