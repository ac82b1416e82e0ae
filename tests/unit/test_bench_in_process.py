"""bench.in_process: the in-process API's throughput beside its ceiling, and its report."""

from __future__ import annotations

import pytest
import uvloop

from bench import in_process
from bench.in_process import Point, ceiling_for, render
from bench.records import CeilingPoint

CEILINGS = [
    CeilingPoint("digits_cnn", 1, 62e-6, 6000),
    CeilingPoint("digits_cnn", 32, 609e-6, 2765),
]


def test_each_point_is_held_against_the_largest_batch_its_callers_can_form() -> None:
    assert ceiling_for(1, CEILINGS).batch == 1
    assert ceiling_for(32, CEILINGS).batch == 32
    assert ceiling_for(64, CEILINGS).batch == 32  # none larger was measured
    assert ceiling_for(16, CEILINGS).batch == 1
    with pytest.raises(ValueError, match="no ceiling point at batch 0 or below"):
        ceiling_for(0, CEILINGS)


def test_throughput_and_mean_batch_come_from_the_window() -> None:
    point = Point("asyncio", 32, requests=5728, batches=179, seconds=1.0)
    assert point.throughput == 5728
    assert point.mean_batch == pytest.approx(32.0, abs=0.01)
    assert Point("threads", 1, requests=0, batches=0, seconds=1.0).mean_batch == 0.0


def test_the_report_has_a_row_per_point_with_its_share_of_the_ceiling() -> None:
    points = [Point("asyncio", 1, 2563, 2563, 1.0), Point("threads", 32, 2687, 84, 1.0)]
    text = render(points, CEILINGS, 5.0, load=(0.5, 1.25, 2.0))
    assert "| asyncio | 1 | 2,563 | 1.0 | 1 | 16,129 | 16% |" in text
    assert "| threads | 32 | 2,687 | 32.0 | 32 | 52,545 | 5% |" in text
    assert "batch 32: 52,545 samples/s (609 µs median, 2765 calls)" in text
    assert "Machine:" in text
    assert "load average when the run began (1, 5, 15 min): 0.50, 1.25, 2.00" in text


def test_a_short_window_counts_requests_and_batches() -> None:
    async def window() -> Point:
        async with in_process._server() as server:
            return await in_process._tasks(server, in_process._feeds(server), 8, 0.3)

    point = uvloop.run(window())
    assert point.requests > 8
    assert 0 < point.batches <= point.requests
    assert 1.0 <= point.mean_batch <= 8.0  # never more than the callers keep in flight
