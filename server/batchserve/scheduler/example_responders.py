"""The contracts of Triton's example decoupled backends, ``repeat`` and ``square``.

NVIDIA's decoupled client examples (``simple_grpc_custom_repeat.py``, the Python backend's
``square_client.py`` and ``repeat_client.py``) and perf_analyzer's decoupled mode are written
against them; serving the same contracts lets them run unchanged. Both end every request
with a final flag that carries no outputs, as the originals do: a stream sends it to the
client only when the client asked for empty final responses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

import numpy as np

from batchserve.core.errors import InvalidArgument
from batchserve.scheduler.responders import CountedRequests, Reply
from batchserve.scheduler.work import Arrays


class RepeatResponder(CountedRequests):
    """``repeat``: one response per element of IN (OUT = the element, IDX = its index), the
    i-th after waiting DELAY[i] milliseconds; WAIT only delays the original's return from
    execution, which no client observes."""

    async def replies(
        self, inputs: Arrays, cancelled: Callable[[], bool] | None, streaming: bool = True
    ) -> AsyncGenerator[Reply, None]:
        values, delays = inputs["IN"].reshape(-1), inputs["DELAY"].reshape(-1)
        if values.shape != delays.shape:
            raise InvalidArgument(
                f"expected IN and DELAY shape to match, got {list(inputs['IN'].shape)} and "
                f"{list(inputs['DELAY'].shape)}"
            )
        if inputs["WAIT"].size != 1:
            raise InvalidArgument("unexpected size for WAIT input")
        self._began()
        try:
            for index, (value, delay) in enumerate(zip(values, delays, strict=True)):
                await asyncio.sleep(int(delay) / 1000)
                if cancelled is not None and cancelled():
                    return
                yield Reply({"OUT": np.array([value], dtype=np.int32),
                             "IDX": np.array([index], dtype=np.uint32)})  # fmt: skip
            yield Reply(final=True)
        finally:
            self._ended()


class SquareResponder(CountedRequests):
    """``square``: N responses for IN = [N], each with OUT = [N] (the original's name
    notwithstanding, nothing is squared); none for N = 0."""

    async def replies(
        self, inputs: Arrays, cancelled: Callable[[], bool] | None, streaming: bool = True
    ) -> AsyncGenerator[Reply, None]:
        count = int(inputs["IN"].reshape(-1)[0]) if inputs["IN"].size == 1 else -1
        if count < 0:
            raise InvalidArgument("input 'IN': expected one non-negative count of responses")
        self._began()
        try:
            for _ in range(count):
                if cancelled is not None and cancelled():
                    return
                yield Reply({"OUT": np.array([count], dtype=np.int32)})
                await asyncio.sleep(0)  # each response leaves before the next is made
            yield Reply(final=True)
        finally:
            self._ended()
