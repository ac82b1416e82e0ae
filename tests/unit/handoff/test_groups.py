"""Requests of one event-loop pass travel together and are split again, row for row."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
from batchserve.core.datatypes import BY_WIRE
from batchserve.core.errors import Unavailable
from batchserve.core.settings import Settings
from batchserve.core.types import InferRequest, InferResponse, Tensor
from batchserve.core.validation import RequestSchema, ValidRequest
from batchserve.dataplane.handoff import descriptors
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.frames import Frame, FrameProtocol
from batchserve.dataplane.handoff.groups import GroupKey, Member, OpenGroups, split
from batchserve.dataplane.handoff.read_mark import READ, ReadMark
from batchserve.dataplane.handoff.worker_plane import RELEASE_DELAY_S, WorkerPlane, _Model
from batchserve.proto.model_config_pb2 import ModelConfig

KEY = GroupKey("m", "", 1, "http", 0, 0, ("y",), (("x", "FP32", (2,)),))
OTHER = KEY._replace(priority=2)


def _member(loop: asyncio.AbstractEventLoop, rows: int, value: float) -> Member:
    return Member({"x": np.full((rows, 2), value, np.float32)}, rows, loop.create_future())


def test_a_group_takes_this_pass_and_the_next_and_goes_at_the_end_of_that() -> None:
    async def run() -> list[tuple[GroupKey, list[int]]]:
        loop = asyncio.get_running_loop()
        sent: list[tuple[GroupKey, list[int]]] = []
        groups = OpenGroups(
            lambda key, members: sent.append((key, [m.batch_size for m in members])),
            loop,
            held=lambda: False,
        )
        for rows, key in ((1, KEY), (2, KEY), (1, OTHER)):
            groups.add(key, _member(loop, rows, 0.0), cap=64)
        assert sent == [], "nothing goes before the pass ends"
        await asyncio.sleep(0)
        assert sent == [], "nor at the end of the first: the loop polls its sockets once more"
        groups.add(KEY, _member(loop, 3, 0.0), cap=64)  # arrived in the next pass: joins
        await asyncio.sleep(0)
        assert sent == [(KEY, [1, 2, 3]), (OTHER, [1])], "gone at the end of the second pass"
        groups.add(KEY, _member(loop, 4, 0.0), cap=64)  # a new pair of passes
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return list(sent)

    assert asyncio.run(run()) == [(KEY, [1, 2, 3]), (OTHER, [1]), (KEY, [4])]


def test_a_group_that_would_pass_the_cap_goes_at_once() -> None:
    async def run() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        sent: list[list[int]] = []
        groups = OpenGroups(
            lambda key, members: sent.append([m.batch_size for m in members]), loop, lambda: False
        )
        for rows in (3, 4, 2, 5):
            groups.add(KEY, _member(loop, rows, 0.0), cap=8)
        assert sent == [[3, 4]]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return list(sent)

    assert asyncio.run(run()) == [[3, 4], [2, 5]]


def test_held_groups_fill_across_passes_and_go_when_released() -> None:
    async def run() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        sent: list[list[int]] = []
        held = [True]
        groups = OpenGroups(
            lambda key, members: sent.append([m.batch_size for m in members]),
            loop,
            lambda: held[0],
        )
        for rows in (1, 2):
            groups.add(KEY, _member(loop, rows, 0.0), cap=8)
            await asyncio.sleep(0)  # each in a pass of its own
        assert sent == [], "held: nothing goes at the end of a pass"
        groups.add(KEY, _member(loop, 6, 0.0), cap=8)  # past the cap: the full one goes
        assert sent == [[1, 2]]
        held[0] = False
        groups.release()
        assert sent == [[1, 2]], "released groups go at the end of the pass"
        await asyncio.sleep(0)
        groups.release()  # nothing open: nothing more goes
        await asyncio.sleep(0)
        return sent

    assert asyncio.run(run()) == [[1, 2], [6]]


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


class _Engine:
    """The model-owning process's end of a real socketpair: records the worker's frames."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.protocol = FrameProtocol(self.frames.append, lambda: None)

    async def wait_for(self, count: int) -> list[Frame]:
        """The request frames (groups and cancels) once ``count`` of them have arrived."""
        for _ in range(1000):
            ours = [f for f in self.frames if f[0] in ("g", "c")]
            if len(ours) >= count:
                return ours
            await asyncio.sleep(0.001)
        raise AssertionError(f"{count} frames never came: {self.frames}")


async def _linked() -> tuple[WorkerPlane, _Engine, _Model]:
    """A worker plane linked to an engine end over a real socket, knowing model 'm'."""
    loop = asyncio.get_running_loop()
    plane = WorkerPlane(Settings(), Arena.create("r", 1 << 16), Arena.create("s", 1 << 16))
    engine = _Engine()
    left, right = socket.socketpair()
    await loop.connect_accepted_socket(lambda: plane.protocol, left)
    await loop.connect_accepted_socket(lambda: engine.protocol, right)
    config = ModelConfig(name="m", max_batch_size=8)
    config.input.add(name="x", data_type=11, dims=[2])  # TYPE_FP32
    config.output.add(name="y", data_type=11, dims=[2])
    return plane, engine, _Model(config, RequestSchema.of(config), 1, 8)


def _close(plane: WorkerPlane, engine: _Engine) -> None:
    plane.protocol.close()
    engine.protocol.close()


def _call(plane: WorkerPlane, known: _Model) -> asyncio.Future[InferResponse]:
    data = np.zeros((1, 2), np.float32)
    request = InferRequest("m", inputs=[Tensor("x", BY_WIRE["FP32"], (1, 2), data)])
    valid = ValidRequest({"x": data}, 1, ("y",))
    return asyncio.ensure_future(plane._grouped(request, known, valid, known.cap))


def test_a_group_is_cancelled_there_once_every_client_has_left() -> None:
    async def run() -> list[Frame]:
        plane, engine, known = await _linked()
        calls = [_call(plane, known) for _ in range(2)]
        await engine.wait_for(1)  # both joined one group, which went
        calls[0].cancel()
        await asyncio.sleep(0.01)
        assert [f for f in engine.frames if f[0] == "c"] == [], "one client is still waiting"
        calls[1].cancel()
        frames = await engine.wait_for(2)
        _close(plane, engine)
        return frames

    frames = asyncio.run(run())
    assert [f[0] for f in frames] == ["g", "c"]
    assert frames[0][-1] == 2  # two requests in the group
    assert frames[1][1] == frames[0][1]  # the group's id is cancelled


def test_requests_wait_in_the_worker_while_its_last_frame_is_unread_there() -> None:
    """The first request goes at once; those decoded while the model-owning process has
    not read it yet are held, however many passes they take, and go together once it says
    it has."""

    async def run() -> list[Frame]:
        plane, engine, known = await _linked()
        calls = [_call(plane, known)]
        await engine.wait_for(1)
        for _ in range(3):
            calls.append(_call(plane, known))
            await asyncio.sleep(0.005)  # each in passes of their own
        assert len(await engine.wait_for(1)) == 1, "held: the engine has not read the first"
        assert ReadMark(plane.requests).advance(1), "the worker holds requests: it is owed a k"
        engine.protocol.send(("k",))
        frames = await engine.wait_for(2)
        for call in calls:
            call.cancel()
        _close(plane, engine)
        return frames

    first, second = asyncio.run(run())
    assert (first[0], first[-1]) == ("g", 1)
    assert (second[0], second[-1]) == ("g", 3)  # the three held requests as one group


def test_held_requests_fail_when_the_model_owning_process_is_gone() -> None:
    async def run() -> BaseException | None:
        plane, engine, known = await _linked()
        first = _call(plane, known)
        await engine.wait_for(1)
        held = _call(plane, known)
        await asyncio.sleep(0.005)
        assert not held.done()
        engine.protocol.close()
        await asyncio.wait_for(asyncio.wait([held]), 5)
        first.cancel()
        _close(plane, engine)
        return held.exception()

    error = asyncio.run(run())
    assert isinstance(error, Unavailable)
    assert "model-owning process is gone" in str(error)


def test_a_worker_that_holds_nothing_is_owed_no_frame_and_sends_at_once() -> None:
    """Reads are counted in the request arena; a worker with nothing held is not told of
    them (no frame wakes it), and its next request still goes at once."""

    async def run() -> list[Frame]:
        plane, engine, known = await _linked()
        first = _call(plane, known)
        await engine.wait_for(1)
        assert not ReadMark(plane.requests).advance(1), "nothing held: no k is owed"
        second = _call(plane, known)
        frames = await engine.wait_for(2)
        for call in (first, second):
            call.cancel()
        _close(plane, engine)
        return frames

    assert [(f[0], f[-1]) for f in asyncio.run(run())] == [("g", 1), ("g", 1)]


def test_held_requests_go_with_the_next_frame_from_the_model_owning_process() -> None:
    """Should the count be read before the worker's flag was seen (no "k" then), the worker
    looks again at every frame from the model-owning process; the answer to its unread frame
    is one that always comes."""

    async def run() -> list[Frame]:
        plane, engine, known = await _linked()
        first = _call(plane, known)
        (group,) = await engine.wait_for(1)
        held = _call(plane, known)
        await asyncio.sleep(0.005)
        assert len(engine.frames) == 1, "held: the first frame is unread"
        plane.requests.control[READ] = 1  # counted, the flag left unseen
        await asyncio.sleep(0.005)
        assert len(engine.frames) == 1, "nothing told the worker yet"
        engine.protocol.send(("e", group[1], "Unavailable", "gone"))
        frames = await engine.wait_for(2)
        held.cancel()
        _close(plane, engine)
        assert isinstance(first.exception(), Unavailable)
        return frames

    assert [(f[0], f[-1]) for f in asyncio.run(run())] == [("g", 1), ("g", 1)]


def test_freed_response_blocks_ride_with_the_next_request_frame() -> None:
    """Blocks a worker's clients are done with go back in the write of its next request,
    not in a write of their own that could wake the model-owning process for nothing."""

    async def run() -> list[Frame]:
        plane, engine, known = await _linked()
        plane._release(128)
        plane._release(256)
        call = _call(plane, known)
        await engine.wait_for(1)
        await asyncio.sleep(RELEASE_DELAY_S * 2)  # the fallback finds nothing left to send
        call.cancel()
        _close(plane, engine)
        return engine.frames

    frames = asyncio.run(run())
    assert [f[0] for f in frames if f[0] in "rg"] == ["r", "g"]
    assert frames[0] == ("r", [128, 256])


def test_freed_response_blocks_go_on_their_own_when_no_request_follows() -> None:
    async def run() -> list[Frame]:
        plane, engine, _ = await _linked()
        plane._release(64)
        await asyncio.sleep(RELEASE_DELAY_S / 2)
        assert engine.frames == [], "they wait a while for a request frame to carry them"
        for _ in range(100):
            if engine.frames:
                break
            await asyncio.sleep(RELEASE_DELAY_S / 4)
        _close(plane, engine)
        return engine.frames

    assert asyncio.run(run()) == [("r", [64])]


def test_a_model_with_preferred_sizes_below_its_cap_takes_requests_one_by_one() -> None:
    """A batch takes whole work items: a group of 3 beside one of 2 would make a batch of 5
    where Triton sends its preferred 4 first. Preferred sizes at the cap (what Triton's
    normalization writes where none is given) change nothing."""

    def model(preferred: list[int]) -> _Model:
        config = ModelConfig(name="m", max_batch_size=8)
        config.input.add(name="x", data_type=11, dims=[2])  # TYPE_FP32
        config.output.add(name="y", data_type=11, dims=[2])
        config.dynamic_batching.preferred_batch_size.extend(preferred)
        return _Model(config, RequestSchema.of(config), 1, 8)

    assert model([]).groups
    assert model([8]).groups
    assert not model([4, 8]).groups
    assert not model([2]).groups
