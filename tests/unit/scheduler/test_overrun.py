"""The margin the objective's plans keep: a high quantile of how late past its planned finish
each recent request was answered."""

from __future__ import annotations

from batchserve.scheduler.overrun import QUANTILE, REFRESH, WINDOW, Overrun


def test_no_margin_until_enough_answers_were_measured() -> None:
    overrun = Overrun()
    for _ in range(REFRESH - 1):
        overrun.record(5_000)
    assert overrun.margin_ns == 0
    overrun.record(5_000)
    assert overrun.margin_ns == 5_000


def test_the_margin_is_the_quantile_of_recent_overruns() -> None:
    overrun = Overrun()
    for value in range(WINDOW):  # 0 .. 255 us, in a shuffled order
        overrun.record((value * 97 % WINDOW) * 1_000)
    expected = int(QUANTILE * (WINDOW - 1)) * 1_000
    assert overrun.margin_ns == expected
    assert overrun.margin_ns < (WINDOW - 1) * 1_000  # the worst few are not covered


def test_old_overruns_are_forgotten() -> None:
    overrun = Overrun()
    for _ in range(WINDOW):
        overrun.record(2_000_000)  # a busy spell
    assert overrun.margin_ns == 2_000_000
    for _ in range(WINDOW):
        overrun.record(100_000)  # the machine is quiet again
    assert overrun.margin_ns == 100_000


def test_answers_ahead_of_plan_ask_for_no_margin() -> None:
    overrun = Overrun()
    for _ in range(REFRESH):
        overrun.record(-300_000)  # batches ran faster than predicted
    assert overrun.margin_ns == 0


def test_a_group_counts_as_its_members_one_by_one() -> None:
    """A worker's group is answered at one time: recorded once with its count, it must leave
    the window and the margin as many single answers would (compared where both refresh:
    groups here end on a multiple of ``REFRESH``; one larger than the window included)."""
    sizes = [REFRESH, 2 * REFRESH, 1, REFRESH - 1, WINDOW + 2 * REFRESH, 3 * REFRESH]
    grouped, single = Overrun(), Overrun()
    margins = set()
    for step, size in enumerate(sizes):
        value = (step * 37 % 11 + 1) * 10_000
        grouped.record(value, size)
        for _ in range(size):
            single.record(value)
        assert grouped.margin_ns == single.margin_ns, (step, size)
        margins.add(grouped.margin_ns)
    assert len(margins) > 2  # the groups moved the margin


def test_a_group_that_crosses_a_refresh_refreshes_the_margin() -> None:
    overrun = Overrun()
    overrun.record(9_000, REFRESH - 1)
    assert overrun.margin_ns == 0  # not measured yet
    overrun.record(9_000, 5)  # the 32nd answer is in this group
    assert overrun.margin_ns == 9_000
