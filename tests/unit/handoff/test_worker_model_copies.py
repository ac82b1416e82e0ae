"""A worker's copies of model configs: after a repository change, new requests wait for the
new copy; requests already being read keep the old one."""

from __future__ import annotations

import asyncio

import numpy as np
from batchserve.core.settings import Settings
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.frames import Frame, pack_frame
from batchserve.dataplane.handoff.worker_plane import WorkerPlane
from batchserve.models.model_config import parse_pbtxt
from fakes import fake_config

KEY = ("fake", "")


def _plane(sent: list[Frame]) -> WorkerPlane:
    plane = WorkerPlane(Settings(), Arena.create("r", 1 << 16), Arena.create("s", 1 << 16))
    plane.protocol.send = sent.append  # type: ignore[method-assign]
    return plane


def _copy(plane: WorkerPlane, cap: int, generation: int) -> None:
    config = fake_config(max_batch_size=cap).SerializeToString()
    plane.protocol.data_received(pack_frame(("m", *KEY, config, generation, cap, 0)))


def test_after_a_repository_change_new_requests_wait_for_the_new_copy() -> None:
    async def run() -> None:
        sent: list[Frame] = []
        plane = _plane(sent)
        assert not plane.knows(*KEY)
        assert sent == [("q", *KEY)]
        _copy(plane, 4, 1)
        assert plane.knows(*KEY)
        reading = plane.schema_lookup(*KEY)  # a request read under the old copy
        plane.protocol.data_received(pack_frame(("v",)))
        assert sent[-1] == ("q", *KEY)
        assert not plane.knows(*KEY)  # a new request waits: its client may have seen the reload
        assert reading().max_batch_size == 4  # the one being read goes on with the old copy
        learning = asyncio.ensure_future(plane.learn(*KEY))
        await asyncio.sleep(0)
        assert not learning.done()
        _copy(plane, 64, 2)
        assert await asyncio.wait_for(learning, 1)
        assert plane.knows(*KEY)
        assert reading().max_batch_size == 64
        assert sent.count(("q", *KEY)) == 2

    asyncio.run(run())


def test_a_model_gone_after_a_repository_change_is_not_known() -> None:
    async def run() -> None:
        plane = _plane([])
        plane.knows(*KEY)
        _copy(plane, 4, 1)
        plane.protocol.data_received(pack_frame(("v",)))
        learning = asyncio.ensure_future(plane.learn(*KEY))
        plane.protocol.data_received(pack_frame(("m", *KEY, None, 0, 0, 0)))
        assert not await asyncio.wait_for(learning, 1)  # goes whole, for the owner's error
        assert not plane.knows(*KEY)

    asyncio.run(run())


def test_a_sequence_model_s_groups_hold_no_more_steps_than_its_batches() -> None:
    """A group is one work item there, batched as one request: rows of a length beyond
    what the model's steps hold travel on their own."""
    config = parse_pbtxt("""
        name: "seq" max_batch_size: 8
        input [{ name: "tokens" data_type: TYPE_INT64 dims: [-1] },
               { name: "lengths" data_type: TYPE_INT64 dims: [1] }]
        output [{ name: "y" data_type: TYPE_FP32 dims: [2] }]
        dynamic_batching {}
        batchserve { sequence_length_input: "lengths" }
    """)

    async def run() -> tuple[int, ...]:
        plane = _plane([])
        plane.knows("seq", "")
        frame = ("m", "seq", "", config.SerializeToString(), 1, 8, 100)
        plane.protocol.data_received(pack_frame(frame))
        known = plane._models[("seq", "")]
        caps = [known.group_cap({"tokens": np.zeros((1, n), np.int64)}) for n in (10, 30, 100, 101)]
        _copy(plane, 4, 1)  # a model counted in rows: its batch cap alone
        return (*caps, plane._models[KEY].group_cap({"x": np.zeros((1, 500), np.float32)}))

    assert asyncio.run(run()) == (8, 3, 1, 0, 4)


def test_an_image_model_s_groups_hold_no_more_pixels_than_its_batches() -> None:
    config = parse_pbtxt("""
        name: "cnn" max_batch_size: 8
        input [{ name: "image" data_type: TYPE_FP32 dims: [3, -1, -1] }]
        output [{ name: "y" data_type: TYPE_FP32 dims: [2] }]
        dynamic_batching {}
    """)

    async def run() -> list[int]:
        plane = _plane([])
        plane.knows("cnn", "")
        frame = ("m", "cnn", "", config.SerializeToString(), 1, 8, 1000)
        plane.protocol.data_received(pack_frame(frame))
        known = plane._models[("cnn", "")]
        return [known.group_cap({"image": np.zeros((1, 3, h, 10), np.float32)})
                for h in (10, 30, 100, 101)]  # fmt: skip

    assert asyncio.run(run()) == [8, 3, 1, 0]
