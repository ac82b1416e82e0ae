"""The table of a sweep, its notes and the setting it recommends."""

from __future__ import annotations

import pytest
from batchserve.profiling.perf_analyzer import Measurement
from batchserve.profiling.plan import Setting
from batchserve.profiling.results import (
    BUDGET_FACTOR,
    Outcome,
    Repeat,
    choose,
    default_budget,
    notes,
    table,
)


def row(throughput: float, p99: float, *, instances: int = 1, size: int = 8) -> Outcome:
    measured = Measurement(16, throughput, p50_ms=p99 / 2, p95_ms=p99 * 0.8, p99_ms=p99)
    return Outcome(Setting(instances, size, 0), 16, measured, average_batch=7.5)


def test_the_highest_throughput_within_the_budget_is_chosen() -> None:
    fast_but_late = row(9000, 12.0)
    best = row(8000, 4.0, size=16)
    outcomes = [row(5000, 1.0), fast_but_late, best, Outcome(Setting(1, 64, 0), 0, problem="x")]
    assert choose(outcomes, budget_ms=5.0) is best


def test_a_tie_in_throughput_goes_to_the_lower_p99() -> None:
    first = row(8000, 4.0)
    quicker = row(7900, 2.0, instances=2)  # within 2 %: a tie
    slower_by_more = row(7000, 1.0, size=4)
    assert choose([first, quicker, slower_by_more], budget_ms=5.0) is quicker


def test_a_tie_goes_to_the_config_as_it_is_so_that_noise_rewrites_nothing() -> None:
    best = row(8000, 2.0, instances=2)
    current = row(7900, 4.0)  # within 2 % of the best, with a higher p99
    outcomes = [best, current, row(9000, 12.0)]
    assert choose(outcomes, budget_ms=5.0, current=current.setting) is current
    assert choose(outcomes, budget_ms=5.0, current=Setting(1, 8, 25000)) is best
    clearly_slower = row(7700, 1.0)  # 3.75 % below the best: no tie
    assert choose([best, clearly_slower], 5.0, current=clearly_slower.setting) is best


def figures(throughput: float, p99: float = 4.0) -> Measurement:
    return Measurement(16, throughput, p50_ms=p99 / 2, p95_ms=p99 * 0.8, p99_ms=p99)


def test_the_noise_is_how_far_apart_the_two_figures_of_the_config_as_it_is_came_out() -> None:
    assert Repeat(figures(1708), figures(909)).noise_percent == pytest.approx(46.8, abs=0.05)
    assert Repeat(figures(909), figures(1708)).noise_percent == pytest.approx(46.8, abs=0.05)
    assert Repeat(figures(0), figures(0)).noise_percent == 0.0


def test_a_sweep_as_noisy_as_a_setting_s_lead_keeps_the_config_as_it_is() -> None:
    # char_lstm's --quick sweep on a shared VM: 1,708 infer/sec first, 909 in the sweep
    current = row(909, 4.0, size=64)
    lead = row(1864, 3.5)  # twice the sweep's figure, 9 % over the first one
    repeat = Repeat(figures(1708), current.measurement or figures(0))
    assert choose([current, lead], 5.0, current=current.setting) is lead, "without it, the lead"
    assert choose([current, lead], 5.0, current=current.setting, repeat=repeat) is current
    far_ahead = row(4000, 3.5, instances=2)  # beyond the 47 % either figure allows
    assert choose([current, far_ahead], 5.0, current.setting, repeat) is far_ahead


def test_the_config_as_it_is_is_within_the_budget_if_either_measurement_was() -> None:
    # a third sweep: 1,856 first (p99 13.0 ms, budget 16.2), 1,787 again with p99 16.5 ms
    current = row(1787, 16.5, size=64)
    slightly_faster = row(1859, 16.0, instances=2)
    repeat = Repeat(figures(1856, 13.0), current.measurement or figures(0))
    assert choose([current, slightly_faster], 16.24, current.setting) is slightly_faster
    assert choose([current, slightly_faster], 16.24, current.setting, repeat) is current
    assert choose([current], 12.0, current.setting, repeat) is None, "neither within 12 ms"


def test_a_quiet_sweep_keeps_the_least_margin() -> None:
    current = row(7700, 1.0)
    best = row(8000, 2.0, instances=2)  # 3.75 % ahead: no tie at 2 %
    quiet = Repeat(figures(7750, 1.0), current.measurement or figures(0))  # 0.6 % apart
    assert choose([best, current], 5.0, current.setting, quiet) is best


def test_nothing_is_chosen_when_no_row_meets_the_budget() -> None:
    assert choose([row(9000, 12.0), Outcome(Setting(1, 8, 0), 0, problem="refused")], 5.0) is None


def test_the_default_budget_is_the_config_as_it_is_with_room_for_noise() -> None:
    as_it_is = Measurement(16, 5000, 2.0, 3.0, 4.0)
    assert default_budget(as_it_is) == 4.0 * BUDGET_FACTOR
    assert 1 < BUDGET_FACTOR < 1.5


def test_the_table_has_a_row_per_outcome_and_marks_the_choice() -> None:
    chosen = row(8000, 4.0)
    refused = Outcome(Setting(2, 128, 1000), 0, problem="refused: does not fit")
    failed = Outcome(Setting(1, 8, 0), 16, problem="perf_analyzer exited with status 99")
    lines = table([chosen, row(9000, 12.0), refused, failed], 5.0, chosen).splitlines()
    assert lines[0].split()[:2] == ["Instances", "Max"]
    assert len(lines) == 5
    assert lines[1].split() == [
        "1",
        "8",
        "0",
        "16",
        "8000.0",
        "2.00",
        "3.20",
        "4.00",
        "7.5",
        "yes",
        "*",
    ]
    assert lines[2].split()[-1] == "no"
    assert lines[3].split() == ["2", "128", "1000", "-", "-", "-", "-", "-", "-", "refused"]
    assert lines[4].split()[-1] == "failed"
    assert len({len(line) for line in lines}) == 1  # right-aligned columns


def test_notes_say_why_a_row_is_empty_unstable_or_capped() -> None:
    unstable = Outcome(
        Setting(1, 8, 0), 16, Measurement(16, 1.0, 1.0, 1.0, 1.0, stable=False), batch_cap=5
    )
    refused = Outcome(Setting(2, 128, 0), 0, problem="refused: too big\n(details)")
    said = notes([row(1.0, 1.0), unstable, refused])
    assert said == [
        "instances 1, max_batch_size 8, queue delay 0 us, concurrency 16: unstable (windows "
        "disagreed by more than the stability asked)",
        "instances 1, max_batch_size 8, queue delay 0 us, concurrency 16: the memory budget "
        "caps batches at 5",
        "instances 2, max_batch_size 128, queue delay 0 us: refused: too big",
    ]
