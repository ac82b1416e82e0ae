"""The socket between a worker and the model-owning process: frames arrive whole, in order,
however the bytes are cut."""

from __future__ import annotations

import asyncio
import socket

from batchserve.dataplane.handoff.frames import Frame, FrameProtocol, pack_frame, read_frame


def test_frames_sent_in_one_pass_arrive_in_order_over_a_real_socket() -> None:
    async def run() -> list[Frame]:
        loop = asyncio.get_running_loop()
        left, right = socket.socketpair()
        received: list[Frame] = []
        done = loop.create_future()

        def handle(frame: Frame) -> None:
            received.append(frame)
            if frame[0] == "end":
                done.set_result(None)

        sender = FrameProtocol(lambda frame: None, lambda: None)
        receiver = FrameProtocol(handle, lambda: None)
        await loop.connect_accepted_socket(lambda: sender, left)
        await loop.connect_accepted_socket(lambda: receiver, right)
        big = bytes(range(256)) * 4096  # 1 MiB: many reads on the other side
        for index in range(100):
            sender.send(("i", index, "model", [(1, 2), None], {"k": True}))
        sender.send(("blob", big))
        sender.send(("end",))
        await asyncio.wait_for(done, 10)
        sender.close()
        receiver.close()
        return received

    received = asyncio.run(run())
    assert [f[1] for f in received[:100]] == list(range(100))
    assert received[0] == ("i", 0, "model", [(1, 2), None], {"k": True})
    assert received[100] == ("blob", bytes(range(256)) * 4096)
    assert received[101] == ("end",)


def test_a_frame_cut_into_single_bytes_is_read_once_complete() -> None:
    async def run() -> list[Frame]:
        received: list[Frame] = []
        protocol = FrameProtocol(received.append, lambda: None)
        data = pack_frame(("a", 1)) + pack_frame(("b", "two"))
        for index in range(len(data)):
            protocol.data_received(data[index : index + 1])
            if index < len(data) - 1:
                assert len(received) <= 1
        return received

    assert asyncio.run(run()) == [("a", 1), ("b", "two")]


def test_the_blocking_reader_takes_the_first_frame() -> None:
    data = pack_frame(("start", "{}", 3))
    position = 0

    def read(n: int) -> bytes:
        nonlocal position
        chunk = data[position : position + n]
        position += n
        return chunk

    assert read_frame(read) == ("start", "{}", 3)


def test_losing_the_socket_is_reported() -> None:
    async def run() -> bool:
        loop = asyncio.get_running_loop()
        left, right = socket.socketpair()
        lost = loop.create_future()
        protocol = FrameProtocol(lambda frame: None, lambda: lost.set_result(True))
        await loop.connect_accepted_socket(lambda: protocol, left)
        right.close()
        return bool(await asyncio.wait_for(lost, 5))

    assert asyncio.run(run())
