"""The sweep plan: which settings a profile measures."""

from __future__ import annotations

import pytest
from batchserve.core.errors import InvalidArgument
from batchserve.profiling.plan import FULL, Axes, Setting, plan

SHIPPED = Setting(instances=1, max_batch_size=64, queue_delay_us=25000)  # digits_cnn as shipped


def test_quick_plan_is_the_few_defaults_plus_the_current_values() -> None:
    settings = plan(SHIPPED, quick=True)
    assert SHIPPED in settings
    assert settings == [
        Setting(1, 1, 0),
        Setting(1, 8, 0),
        Setting(1, 8, 25000),
        Setting(1, 64, 0),
        Setting(1, 64, 25000),
        Setting(2, 1, 0),
        Setting(2, 8, 0),
        Setting(2, 8, 25000),
        Setting(2, 64, 0),
        Setting(2, 64, 25000),
    ]


def test_full_plan_is_the_grid_with_one_delay_where_a_batch_holds_one_request() -> None:
    settings = plan(Setting(3, 48, 500), quick=False)
    assert FULL.instances is not None
    assert FULL.max_batch_sizes is not None
    assert FULL.queue_delays_us is not None
    assert {s.instances for s in settings} == {*FULL.instances, 3}
    assert {s.max_batch_size for s in settings} == {*FULL.max_batch_sizes, 48}
    assert {s.queue_delay_us for s in settings} == {*FULL.queue_delays_us, 500}
    assert [s.queue_delay_us for s in settings if s.max_batch_size == 1] == [0] * 4
    delays = len(FULL.queue_delays_us) + 1
    sizes = len(FULL.max_batch_sizes) + 1
    assert len(settings) == 4 * (1 + (sizes - 1) * delays)
    assert len(set(settings)) == len(settings)


def test_given_axes_are_taken_exactly_without_the_current_value() -> None:
    given = Axes(instances=[2, 1, 2], max_batch_sizes=[16], queue_delays_us=[100])
    assert plan(SHIPPED, quick=True, given=given) == [Setting(1, 16, 100), Setting(2, 16, 100)]


def test_a_model_that_does_not_batch_is_swept_over_instances_only() -> None:
    settings = plan(Setting(1, 0, 0), quick=False)
    assert {(s.max_batch_size, s.queue_delay_us) for s in settings} == {(0, 0)}
    assert [s.instances for s in settings] == [1, 2, 4]
    with pytest.raises(InvalidArgument, match="does not batch"):
        plan(Setting(1, 0, 0), quick=True, given=Axes(max_batch_sizes=[8]))


@pytest.mark.parametrize(
    ("given", "flag"),
    [
        (Axes(instances=[0, 1]), "--instance-counts"),
        (Axes(max_batch_sizes=[0]), "--max-batch-sizes"),
        (Axes(queue_delays_us=[-1]), "--queue-delays"),
        (Axes(instances=[]), "--instance-counts"),
    ],
)
def test_values_outside_a_fields_range_are_refused(given: Axes, flag: str) -> None:
    with pytest.raises(InvalidArgument, match=flag):
        plan(SHIPPED, quick=True, given=given)


def test_the_current_setting_is_kept_even_with_a_delay_that_changes_nothing() -> None:
    current = Setting(1, 1, 500)  # batches of one: the delay is moot, but it is the file's
    settings = plan(current, quick=True)
    assert current in settings
    assert [s for s in settings if s.max_batch_size == 1] == [
        Setting(1, 1, 0),
        Setting(1, 1, 500),
        Setting(2, 1, 0),
    ]
    assert settings == sorted(settings)


def test_given_axes_without_the_current_values_leave_it_out() -> None:
    given = Axes(max_batch_sizes=[8])
    assert SHIPPED not in plan(SHIPPED, quick=True, given=given)


def test_a_sequence_model_is_swept_over_instances_and_batch_sizes_without_a_delay() -> None:
    """As Model Analyzer sweeps one: its batcher is the sequence batcher, not the dynamic."""
    settings = plan(Setting(1, 64, None), quick=True)
    assert settings == [Setting(n, size, None) for n in (1, 2) for size in (1, 8, 64)]
    assert [s.label for s in settings[:1]] == ["instances 1, max_batch_size 1"]
    with pytest.raises(InvalidArgument, match="sequence-batched"):
        plan(Setting(1, 64, None), quick=True, given=Axes(queue_delays_us=[0]))
    assert plan(Setting(2, 0, None), quick=True) == [Setting(1, 0, None), Setting(2, 0, None)]
