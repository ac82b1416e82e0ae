"""The batch-time model: a line fitted to measured batches, following a change."""

from __future__ import annotations

import pytest
from batchserve.scheduler.batch_time import BatchTimeModel

MS = 1_000_000


def test_nothing_known_predicts_nothing() -> None:
    model = BatchTimeModel()
    assert not model.known
    assert model.predict(8) == 0


def test_fixed_and_per_sample_costs_are_recovered() -> None:
    model = BatchTimeModel()
    for samples in (1, 8, 32, 1, 8, 32):
        model.record(samples, 2 * MS + samples * 100_000)
    fixed, per_sample = model.line()
    assert fixed == pytest.approx(2 * MS, rel=1e-6)
    assert per_sample == pytest.approx(100_000, rel=1e-6)
    assert model.predict(16) == pytest.approx(3.6 * MS, rel=1e-6)


def test_one_size_seen_is_read_as_proportional() -> None:
    model = BatchTimeModel()
    model.record(4, 4 * MS)
    assert model.line() == (0.0, 1 * MS)
    assert model.predict(8) == 8 * MS


def test_larger_batches_no_slower_are_all_fixed_cost() -> None:
    model = BatchTimeModel()
    model.record(1, 5 * MS)
    model.record(32, 4 * MS)
    fixed, per_sample = model.line()
    assert per_sample == 0.0
    assert 4 * MS < fixed < 5 * MS  # their (recency-weighted) mean


def test_a_slower_machine_is_followed_within_tens_of_batches() -> None:
    model = BatchTimeModel()
    for _ in range(50):
        model.record(1, 1 * MS)
        model.record(8, 8 * MS)
    for _ in range(40):  # other work now shares the cores: everything takes twice as long
        model.record(1, 2 * MS)
        model.record(8, 16 * MS)
    assert model.predict(8) == pytest.approx(16 * MS, rel=0.05)


def test_a_prediction_follows_every_record_after_it() -> None:
    """The fitted line is kept between records (the dispatch predicts on every pass), so a
    record must drop it: the next prediction sees the new execution."""
    model = BatchTimeModel()
    model.record(1, 1 * MS)
    model.record(8, 8 * MS)
    before = model.predict(8)
    assert model.predict(8) == before  # asked again: the same line
    model.record(8, 30 * MS)
    assert model.predict(8) > before
