"""Requests of one event-loop pass travel together and are split again, row for row."""

from __future__ import annotations

import asyncio

import numpy as np
from batchserve.core.datatypes import BY_WIRE
from batchserve.core.settings import Settings
from batchserve.core.types import InferRequest, Tensor
from batchserve.core.validation import RequestSchema, ValidRequest
from batchserve.dataplane.handoff import descriptors
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.groups import GroupKey, Member, OpenGroups, split
from batchserve.dataplane.handoff.worker_plane import WorkerPlane, _Model
from batchserve.proto.model_config_pb2 import ModelConfig

KEY = GroupKey("m", "", 1, "http", 0, 0, ("y",), (("x", "FP32", (2,)),))
OTHER = KEY._replace(priority=2)


def _member(loop: asyncio.AbstractEventLoop, rows: int, value: float) -> Member:
    return Member({"x": np.full((rows, 2), value, np.float32)}, rows, loop.create_future())


def test_a_pass_sends_one_group_per_key_when_it_ends() -> None:
    async def run() -> list[tuple[GroupKey, list[int]]]:
        loop = asyncio.get_running_loop()
        sent: list[tuple[GroupKey, list[int]]] = []
        groups = OpenGroups(
            lambda key, members: sent.append((key, [m.batch_size for m in members])), loop
        )
        for rows, key in ((1, KEY), (2, KEY), (1, OTHER), (3, KEY)):
            groups.add(key, _member(loop, rows, 0.0), cap=64)
        assert sent == [], "nothing goes before the pass ends"
        await asyncio.sleep(0)
        return sent

    assert asyncio.run(run()) == [(KEY, [1, 2, 3]), (OTHER, [1])]


def test_a_group_that_would_pass_the_cap_goes_at_once() -> None:
    async def run() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        sent: list[list[int]] = []
        groups = OpenGroups(lambda key, members: sent.append([m.batch_size for m in members]), loop)
        for rows in (3, 4, 2, 5):
            groups.add(KEY, _member(loop, rows, 0.0), cap=8)
        assert sent == [[3, 4]]
        await asyncio.sleep(0)
        return sent

    assert asyncio.run(run()) == [[3, 4], [2, 5]]


def test_rows_are_written_back_to_back_and_shared_back_by_row() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        arena = Arena.create("rows", 1 << 16)
        members = [_member(loop, rows, float(i)) for i, rows in enumerate((2, 1, 3))]
        block, inline, (described,) = descriptors.place_rows(
            [("x", BY_WIRE["FP32"], (6, 2))], [m.arrays for m in members], arena
        )
        stacked = descriptors.read(arena, block, inline, described)
        np.testing.assert_array_equal(stacked, np.concatenate([m.arrays["x"] for m in members]))
        members[1].future.cancel()  # a client that left takes no share
        split(("o",), {"y": stacked * 10}, members)
        first, third = members[0].future.result(), members[2].future.result()
        np.testing.assert_array_equal(first.output("y"), np.zeros((2, 2)))
        np.testing.assert_array_equal(third.output("y"), np.full((3, 2), 20.0))

    asyncio.run(run())


def test_rows_go_inline_when_the_arena_is_full() -> None:
    arena = Arena.create("small", 4096)
    parts = [{"x": np.arange(1000, dtype=np.float32).reshape(500, 2)} for _ in range(3)]
    block, inline, (described,) = descriptors.place_rows(
        [("x", BY_WIRE["FP32"], (1500, 2))], parts, arena
    )
    assert block == descriptors.INLINE
    np.testing.assert_array_equal(
        descriptors.read(arena, block, inline, described), np.concatenate([p["x"] for p in parts])
    )


def test_a_group_is_cancelled_there_once_every_client_has_left() -> None:
    async def run() -> list[tuple[object, ...]]:
        plane = WorkerPlane(Settings(), Arena.create("r", 1 << 16), Arena.create("s", 1 << 16))
        sent: list[tuple[object, ...]] = []
        plane.protocol.send = sent.append  # type: ignore[method-assign]
        config = ModelConfig(name="m", max_batch_size=8)
        config.input.add(name="x", data_type=11, dims=[2])  # TYPE_FP32
        config.output.add(name="y", data_type=11, dims=[2])
        known = _Model(config, RequestSchema.of(config), 1, 8)

        def request() -> InferRequest:
            data = np.zeros((1, 2), np.float32)
            return InferRequest("m", inputs=[Tensor("x", BY_WIRE["FP32"], (1, 2), data)])

        calls = []
        for _ in range(2):
            r = request()
            valid = ValidRequest({"x": r.inputs[0].data}, 1, ("y",))
            calls.append(asyncio.ensure_future(plane._grouped(r, known, valid)))
        await asyncio.sleep(0.01)  # both joined one group, which went
        groups = [f for f in sent if f[0] == "g"]
        calls[0].cancel()
        await asyncio.sleep(0)
        assert [f for f in sent if f[0] == "c"] == [], "one client is still waiting"
        calls[1].cancel()
        await asyncio.sleep(0)
        return [*groups, *(f for f in sent if f[0] == "c")]

    frames = asyncio.run(run())
    assert [f[0] for f in frames] == ["g", "c"]
    assert frames[0][-1] == 2  # two requests in the group
    assert frames[1][1] == frames[0][1]  # the group's id is cancelled
