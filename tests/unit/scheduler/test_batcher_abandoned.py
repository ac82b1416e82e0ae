"""Requests whose clients went away give their places in a full queue to new ones at once,
not only when an instance is next free to drop them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from batchserve.core.errors import Overloaded
from fakes import FakeBackend
from harness import answer, answers, hold_first, item, make_batcher

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("ordering", [False, True], ids=["unordered", "preserve_ordering"])
async def test_a_full_queue_of_abandoned_requests_admits_new_ones(ordering: bool) -> None:
    backend = FakeBackend()
    extra = (
        "dynamic_batching { default_queue_policy { max_queue_size: 2 } "
        f"preserve_ordering: {str(ordering).lower()} }}"
    )
    batcher = make_batcher([backend], extra=extra)
    first = await hold_first(batcher, backend)
    cancelled, gone = item(1, 1.0), item(1, 2.0)
    batcher.submit(cancelled)
    batcher.submit(gone)
    cancelled.future.cancel()  # the handler's task was cancelled (disconnect, gRPC cancel)
    gone.is_cancelled = lambda: True  # or the adapter reports the client gone

    newer = [item(1, 3.0), item(1, 4.0)]
    for queued in newer:
        batcher.submit(queued)  # refused with Overloaded before the fix
    with pytest.raises(Overloaded, match="queue is full"):
        batcher.submit(item(1, 5.0))  # live requests still count in full

    assert len(batcher.queue) == 2
    backend.gate.set()
    await answer(first)
    results = await answers(*newer)
    assert backend.batches == [1, 2]  # the abandoned ones never ran
    assert [r["y"][0, 0] for r in results] == [7.0, 9.0]
    np.testing.assert_array_equal(results[1]["total"], [[16.0]])
    assert batcher.stats.execution_count == 2
    assert gone.future.cancelled()  # settled (in its turn), so nobody awaits it forever
    await asyncio.wait_for(batcher.close(), 10)
