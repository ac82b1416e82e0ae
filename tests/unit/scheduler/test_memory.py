"""Memory budgets: the fitted profile, the batch cap, budget flags, reservations and refusals."""

from __future__ import annotations

import threading

import pytest
from batchserve.core.budgets import (
    DEFAULT_BUDGET,
    BudgetSpec,
    format_bytes,
    parse_budget,
    parse_budgets,
)
from batchserve.core.device import CPU, Device
from batchserve.core.errors import ModelConfigError, OutOfMemory, Unavailable
from batchserve.proto.model_config_pb2 import TYPE_FP32, TYPE_STRING, ModelConfig
from batchserve.scheduler.memory import (
    AMPLIFICATION_COUNTED,
    PROBE_SEQUENCE_LENGTH,
    DeviceBudget,
    Loan,
    MemoryBudgets,
    MemoryProfile,
    MemorySample,
    ModelReservations,
    Reservation,
    StepBudget,
    arena_limit_bytes,
    derive_cap,
    fewest_positions,
    probe_length,
)
from hypothesis import given
from hypothesis import strategies as st

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def samples(*pairs: tuple[int, int]) -> list[MemorySample]:
    return [MemorySample(batch, nbytes) for batch, nbytes in pairs]


def flat(nbytes: int) -> MemoryProfile:
    return MemoryProfile(nbytes, 0)


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (512, "512 B"),
        (96 * MIB, "96 MiB"),
        (int(1.2 * GIB), "1.2 GiB"),
        (2 * GIB, "2.0 GiB"),
        (300 * MIB, "300 MiB"),
        (5 * 1024 * GIB, "5.0 TiB"),
    ],
)
def test_format_bytes_reads_like_an_operator_writes(nbytes: int, text: str):
    assert format_bytes(nbytes) == text


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("0.8", BudgetSpec(fraction=0.8)),
        ("1.0", BudgetSpec(fraction=1.0)),
        ("80%", BudgetSpec(fraction=0.8)),
        ("512MiB", BudgetSpec(nbytes=512 * MIB)),
        ("8GiB", BudgetSpec(nbytes=8 * GIB)),
        ("8 gib", BudgetSpec(nbytes=8 * GIB)),
        ("8Gi", BudgetSpec(nbytes=8 * GIB)),
        ("1.5GiB", BudgetSpec(nbytes=int(1.5 * GIB))),
        ("8GB", BudgetSpec(nbytes=8 * 10**9)),
        ("2147483648", BudgetSpec(nbytes=2 * GIB)),
        (" 4194304 ", BudgetSpec(nbytes=4 * MIB)),
    ],
)
def test_parse_budget_accepts_fractions_and_sizes(text: str, spec: BudgetSpec):
    assert parse_budget(text) == spec


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "neither a fraction"),
        ("lots", "neither a fraction"),
        ("-1GiB", "neither a fraction"),
        ("8 gigs", "neither a fraction"),
        ("1.5", r"fraction 1\.5 is not in \(0, 1\]"),
        ("0.0", r"fraction 0 is not in \(0, 1\]"),
        ("150%", r"fraction 1\.5 is not in \(0, 1\]"),
        ("1", "below 1 MiB"),
        ("512KiB", "below 1 MiB"),
    ],
)
def test_parse_budget_rejects_junk_naming_it(text: str, problem: str):
    with pytest.raises(ValueError, match=problem) as caught:
        parse_budget(text)
    assert repr(text) in str(caught.value)


def test_parse_budgets_one_value_for_all_or_per_kind():
    assert parse_budgets(None) == {"cpu": DEFAULT_BUDGET, "gpu": DEFAULT_BUDGET}
    assert parse_budgets("0.5") == {"cpu": BudgetSpec(0.5), "gpu": BudgetSpec(0.5)}
    assert parse_budgets("cpu=8GiB") == {"cpu": BudgetSpec(nbytes=8 * GIB), "gpu": DEFAULT_BUDGET}
    both = parse_budgets("gpu=0.7, CPU=2GiB")
    assert both == {"cpu": BudgetSpec(nbytes=2 * GIB), "gpu": BudgetSpec(0.7)}


@pytest.mark.parametrize("text", ["tpu=1GiB", "0.5,gpu=0.5", "cpu=junk"])
def test_parse_budgets_rejects_unknown_kinds_and_values(text: str):
    with pytest.raises(ValueError, match="memory budget"):
        parse_budgets(text)


def test_budget_spec_resolves_against_the_device_total():
    assert BudgetSpec(fraction=0.5).of(8 * GIB) == 4 * GIB
    assert BudgetSpec(nbytes=2 * GIB).of(8 * GIB) == 2 * GIB
    assert BudgetSpec(nbytes=16 * GIB).of(8 * GIB) == 8 * GIB  # never more than the device
    with pytest.raises(ValueError, match="either a fraction or a byte count"):
        BudgetSpec()


def test_fit_recovers_an_exact_line():
    profile = MemoryProfile.fit(samples((1, 1010), (16, 1160), (64, 1640)))
    assert (profile.fixed_bytes, profile.per_sample_bytes) == (1000, 10)
    assert profile.predict(100) == 2000


def test_fit_is_raised_to_cover_every_measurement():
    measured = samples((1, 1000), (16, 1500), (64, 1640))  # the middle one sits above the line
    profile = MemoryProfile.fit(measured)
    assert all(profile.predict(s.batch_size) >= s.nbytes for s in measured)
    assert profile.predict(16) - 1500 < 100  # raised by the shortfall, not far past it


def test_fit_clamps_a_falling_line_to_flat():
    profile = MemoryProfile.fit(samples((1, 5000), (64, 4000), (256, 4500)))
    assert profile.per_sample_bytes == 0
    assert profile.fixed_bytes == 5000


def test_fit_clamps_a_negative_intercept_to_zero():
    profile = MemoryProfile.fit(samples((1, 0), (64, 0), (256, 1_000_000)))
    assert profile.fixed_bytes >= 0
    assert profile.per_sample_bytes > 0
    assert profile.predict(256) >= 1_000_000


def test_fit_with_one_batch_size_is_flat_and_empty_is_refused():
    assert MemoryProfile.fit(samples((1, 700))) == MemoryProfile(700, 0, tuple(samples((1, 700))))
    with pytest.raises(ValueError, match="at least one measurement"):
        MemoryProfile.fit([])


@given(st.lists(st.tuples(st.integers(1, 1024), st.integers(0, 1 << 34)), min_size=1, max_size=6))
def test_fit_never_predicts_below_a_measurement(pairs: list[tuple[int, int]]):
    measured = samples(*pairs)
    profile = MemoryProfile.fit(measured)
    assert profile.fixed_bytes >= 0
    assert profile.per_sample_bytes >= 0
    assert all(profile.predict(s.batch_size) >= s.nbytes for s in measured)


def test_derive_cap_is_the_largest_batch_that_fits():
    profile = MemoryProfile(100 * MIB, 1 * MIB)
    assert derive_cap(profile, 164 * MIB, 1024) == 64
    assert derive_cap(profile, 164 * MIB - 1, 1024) == 63
    assert derive_cap(profile, 164 * MIB, 32) == 32
    assert derive_cap(profile, 101 * MIB - 1, 1024) == 0
    assert derive_cap(flat(10 * MIB), 10 * MIB, 8) == 8
    with pytest.raises(ValueError, match="max_batch_size 0"):
        derive_cap(profile, GIB, 0)


@given(
    st.integers(0, 1 << 30), st.integers(0, 1 << 20), st.integers(0, 1 << 32), st.integers(1, 4096)
)
def test_derive_cap_fits_and_one_more_would_not(fixed: int, per: int, available: int, most: int):
    profile = MemoryProfile(fixed, per)
    cap = derive_cap(profile, available, most)
    assert 0 <= cap <= most
    if cap:
        assert profile.predict(cap) <= available
    if cap < most:
        assert profile.predict(cap + 1) > available


def test_arena_limit_leaves_a_margin_over_the_cap():
    profile = MemoryProfile(8 * MIB, 64 * KIB)
    assert arena_limit_bytes(profile, 64) == int(12 * MIB * 1.25)
    assert arena_limit_bytes(profile, 64, margin=0.0) == profile.predict(64)


def test_reserve_takes_the_prediction_at_the_cap_and_release_gives_it_back():
    budget = DeviceBudget(CPU, 200 * MIB)
    reservation = budget.reserve("digits", MemoryProfile(100 * MIB, 1 * MIB), 256)
    assert reservation.batch_cap == 100
    assert reservation.nbytes == 200 * MIB
    assert reservation.device == CPU
    assert budget.available() == 0
    assert budget.holdings() == {"digits": 200 * MIB}
    reservation.release()
    reservation.release()  # twice is harmless
    assert budget.available() == 200 * MIB
    assert budget.holdings() == {}


def test_instances_share_the_device_and_later_ones_get_what_is_left():
    budget = DeviceBudget(Device("gpu", 1), 100 * MIB)
    lstm = budget.reserve("lstm", flat(4 * MIB), 8)
    first = budget.reserve("cnn", MemoryProfile(10 * MIB, 1 * MIB), 64)
    second = budget.reserve("cnn", MemoryProfile(10 * MIB, 1 * MIB), 64)
    assert (lstm.batch_cap, first.batch_cap, second.batch_cap) == (8, 64, 12)
    assert budget.holdings() == {"lstm": 4 * MIB, "cnn": 74 * MIB + 22 * MIB}
    assert budget.available() == 0
    first.release()
    assert budget.available() == 74 * MIB


def test_a_load_that_does_not_fit_beside_others_is_out_of_memory_with_the_numbers():
    budget = DeviceBudget(CPU, 2 * GIB)
    budget.reserve("digits_cnn", flat(12 * MIB), 1)
    budget.reserve("char_lstm", flat(40 * MIB), 1)
    budget.reserve("filler", flat(2 * GIB - 352 * MIB), 1)
    big = MemoryProfile(int(1.1 * GIB), 96 * MIB)
    with pytest.raises(OutOfMemory) as caught:
        budget.reserve("big", big, 64)
    assert caught.value.message == (
        "model 'big' needs 1.2 GiB at batch 1 (fixed 1.1 GiB + 96 MiB per sample) but only "
        "300 MiB of the cpu budget of 2.0 GiB is free (held: char_lstm 40 MiB, digits_cnn "
        "12 MiB, filler 1.7 GiB)"
    )
    assert budget.holdings().keys() == {"digits_cnn", "char_lstm", "filler"}  # nothing taken


def test_a_model_larger_than_the_whole_budget_is_a_config_error():
    budget = DeviceBudget(Device("gpu", 0), 1 * GIB)
    with pytest.raises(ModelConfigError, match=r"needs 2\.0 GiB .* whole gpu:0 budget is 1\.0 GiB"):
        budget.reserve("huge", flat(2 * GIB), 8)


def test_the_model_limit_caps_its_reservation_below_the_device():
    budget = DeviceBudget(CPU, 10 * GIB)
    capped = budget.reserve("m", MemoryProfile(10 * MIB, 1 * MIB), 1024, limit_bytes=42 * MIB)
    assert capped.batch_cap == 32
    with pytest.raises(ModelConfigError, match=r"memory_budget_bytes leaves 5\.0 MiB"):
        budget.reserve("m", MemoryProfile(10 * MIB, 1 * MIB), 1024, limit_bytes=5 * MIB)


def test_concurrent_reservations_never_overcommit():
    budget = DeviceBudget(CPU, 10 * MIB)
    start = threading.Barrier(16)
    won: list[int] = []
    lost: list[str] = []

    def load(i: int) -> None:
        start.wait()
        try:
            won.append(budget.reserve(f"m{i}", flat(1 * MIB), 1).nbytes)
        except OutOfMemory as exc:
            lost.append(exc.message)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(won), len(lost)) == (10, 6)
    assert budget.available() == 0


def test_model_reservations_share_the_config_budget_across_instances():
    config = ModelConfig(name="cnn", max_batch_size=64)
    config.batchserve.memory_budget_bytes = 50 * MIB
    model = ModelReservations.from_config(config)
    cpu, gpu = DeviceBudget(CPU, GIB), DeviceBudget(Device("gpu", 0), GIB)
    profile = MemoryProfile(10 * MIB, 256 * KIB)
    assert model.allowance(cpu) == 50 * MIB
    first = model.reserve(cpu, profile)
    assert first.batch_cap == 64  # 26 MiB
    assert model.allowance(gpu) == 24 * MIB
    second = model.reserve(gpu, profile)
    assert second.batch_cap == 56  # what the 24 MiB left allows
    with pytest.raises(ModelConfigError, match=r"model 'cnn' .* leaves 0 B for this instance"):
        model.reserve(cpu, profile)
    model.release()
    assert cpu.available() == gpu.available() == GIB
    assert model.reservations == ()


def test_instances_loaded_together_share_the_model_budget_evenly():
    """Taking all it could, the first of two instances would leave the second a cap of 56
    (the test above), and the model batches at the smaller cap; shared, both get 60."""
    config = ModelConfig(name="cnn", max_batch_size=64)
    config.batchserve.memory_budget_bytes = 50 * MIB
    model = ModelReservations.from_config(config)
    budget = DeviceBudget(CPU, GIB)
    profile = MemoryProfile(10 * MIB, 256 * KIB)
    assert model.allowance(budget, sharing=2) == 25 * MIB
    first = model.reserve(budget, profile, sharing=2)
    assert model.allowance(budget, sharing=1) == 25 * MIB
    second = model.reserve(budget, profile, sharing=1)
    assert (first.batch_cap, second.batch_cap) == (60, 60)
    with pytest.raises(ModelConfigError, match=r"leaves 0 B for this instance"):
        model.reserve(budget, profile)


def test_a_share_smaller_than_one_sample_takes_one_where_what_is_left_holds_it():
    """A first instance that measured its runtime's one-time costs (10 MiB) beside a second
    that did not (1 MiB): even shares of 12 MiB would refuse the first; one sample each fits."""
    config = ModelConfig(name="cnn", max_batch_size=64)
    config.batchserve.memory_budget_bytes = 12 * MIB
    model = ModelReservations.from_config(config)
    budget = DeviceBudget(CPU, GIB)
    first = model.reserve(budget, MemoryProfile(10 * MIB, 256 * KIB), sharing=2)
    second = model.reserve(budget, MemoryProfile(MIB, 256 * KIB), sharing=1)
    assert (first.batch_cap, second.batch_cap) == (1, 3)
    assert model.allowance(budget) == 0
    config.batchserve.memory_budget_bytes = 9 * MIB  # less than one sample: refused, naming it
    small = ModelReservations.from_config(config)
    with pytest.raises(ModelConfigError, match=r"leaves 9\.0 MiB for this instance"):
        small.reserve(budget, MemoryProfile(10 * MIB, 256 * KIB), sharing=2)


def test_a_reload_may_hold_the_old_and_new_version_under_one_name():
    budget = DeviceBudget(CPU, 100 * MIB)
    config = ModelConfig(name="cnn", max_batch_size=0)  # no batch axis: one sample at a time
    old, new = ModelReservations.from_config(config), ModelReservations.from_config(config)
    assert old.reserve(budget, MemoryProfile(30 * MIB, MIB)).batch_cap == 1
    new.reserve(budget, MemoryProfile(30 * MIB, MIB))
    assert budget.holdings() == {"cnn": 62 * MIB}
    old.release()
    assert budget.holdings() == {"cnn": 31 * MIB}


def test_memory_budgets_make_one_budget_per_device_from_its_total():
    totals = {CPU: 8 * GIB, Device("gpu", 0): 16 * GIB, Device("gpu", 1): 24 * GIB}
    budgets = MemoryBudgets(parse_budgets("cpu=2GiB,gpu=0.5"), totals.__getitem__)
    gpu1 = budgets.for_device(Device("gpu", 1))
    assert budgets.for_device(Device("gpu", 1)) is gpu1
    assert gpu1.total_bytes == 12 * GIB
    assert budgets.for_device(CPU).total_bytes == 2 * GIB
    assert budgets.for_device(Device("gpu", 0)).total_bytes == 8 * GIB
    assert [str(b.device) for b in budgets.budgets()] == ["cpu", "gpu:0", "gpu:1"]


def test_rows_are_reserved_as_far_as_they_fit_under_the_model_s_own_limit() -> None:
    budget = DeviceBudget(CPU, 10_000)
    model = ModelReservations("seq", max_batch_size=8, limit_bytes=1_000)
    held = model.reserve_rows(budget, row_bytes=300, most=4096)
    assert held.batch_cap == 3  # 900 of the model's 1,000 bytes
    assert budget.holdings() == {"seq": 900}
    roomy = ModelReservations("roomy", max_batch_size=8).reserve_rows(budget, 300, most=5)
    assert roomy.batch_cap == 5  # the most asked for, though more would fit
    model.release()
    assert budget.holdings() == {"roomy": 1_500}


def test_instances_that_cannot_all_fit_are_refused_before_they_load() -> None:
    """``count: 100000`` used to be probed one instance at a time until the budget ran out."""
    budget = DeviceBudget(CPU, 10 * MIB)
    each = MemoryProfile(fixed_bytes=MIB, per_sample_bytes=KIB)
    ModelReservations("m", 8).check_room(budget, each, 9)  # 9 x 1 MiB + 1 KiB fits in 10 MiB
    with pytest.raises(ModelConfigError) as never:
        ModelReservations("m", 8).check_room(budget, each, 100_000)
    assert "model 'm': 100000 more instance(s) on cpu need at least" in never.value.message
    assert "more than the budget of 10 MiB; lower the instance_group count" in never.value.message
    with pytest.raises(ModelConfigError, match=r"more than its memory_budget_bytes of 2\.0 MiB"):
        ModelReservations("m", 8, limit_bytes=2 * MIB).check_room(budget, each, 3)
    with pytest.raises(ModelConfigError, match="more than the budget of 10 MiB"):  # the smaller
        ModelReservations("m", 8, limit_bytes=GIB).check_room(budget, each, 100)
    other = ModelReservations("other", 8).reserve(budget, MemoryProfile(8 * MIB, 0))
    with pytest.raises(OutOfMemory, match=r"9 more instance\(s\) on cpu .* but 2.0 MiB is free"):
        ModelReservations("m", 8).check_room(budget, each, 9)
    other.release()
    ModelReservations("m", 8).check_room(budget, each, 9)


def _sequence_config(max_batch_size: int = 8, extra: str = "") -> ModelConfig:
    config = ModelConfig(name="seq", max_batch_size=max_batch_size)
    config.batchserve.sequence_length_input = "lengths"
    if extra:
        config.batchserve.max_batch_steps = int(extra)
    return config


def test_a_sequence_model_s_batches_are_counted_in_steps_of_the_probe_s_rows() -> None:
    assert StepBudget.from_config(_sequence_config()) == StepBudget(PROBE_SEQUENCE_LENGTH, 1024)
    assert StepBudget.from_config(_sequence_config(extra="20000")) == StepBudget(128, 20000)
    assert StepBudget.from_config(ModelConfig(name="rows", max_batch_size=8)) is None
    assert StepBudget.from_config(_sequence_config(max_batch_size=0)) is None  # no batch axis


def test_a_sequence_model_reserves_its_steps_at_the_memory_of_the_probe_s_rows() -> None:
    """8 rows of 128 steps: the same bytes as 8 rows reserved, and 1024 steps to batch."""
    profile = MemoryProfile(10 * MIB, 128 * KIB)  # 1 KiB a step at the probe's 128
    budget = DeviceBudget(CPU, GIB)
    held = ModelReservations.from_config(_sequence_config()).reserve(budget, profile)
    assert (held.batch_cap, held.batch_steps) == (8, 1024)
    assert held.nbytes == profile.predict(8) == 10 * MIB + 1024 * KIB


def test_a_tight_budget_holds_fewer_steps_and_rows_and_none_is_refused() -> None:
    profile = MemoryProfile(10 * MIB, 128 * KIB)
    held = ModelReservations.from_config(_sequence_config()).reserve(
        DeviceBudget(CPU, 10 * MIB + 300 * KIB), profile
    )
    assert (held.batch_cap, held.batch_steps) == (2, 300)  # 300 steps: two probe rows
    with pytest.raises(ModelConfigError, match=r"at batch 1 \(fixed 10 MiB \+ 128 KiB per"):
        ModelReservations.from_config(_sequence_config()).reserve(
            DeviceBudget(CPU, 10 * MIB + 127 * KIB), profile
        )  # not one row of the probe's length


def test_max_batch_steps_reserves_for_longer_batches_than_the_probe_ran() -> None:
    profile = MemoryProfile(10 * MIB, 128 * KIB)
    budget = DeviceBudget(CPU, GIB)
    held = ModelReservations.from_config(_sequence_config(extra="20000")).reserve(budget, profile)
    assert (held.batch_cap, held.batch_steps) == (8, 20000)
    assert held.nbytes == 10 * MIB + 20000 * KIB
    fewer = ModelReservations.from_config(_sequence_config(extra="100")).reserve(budget, profile)
    assert (fewer.batch_cap, fewer.batch_steps) == (8, 100)  # rows of 12 steps still batch 8
    assert fewer.nbytes == 10 * MIB + 100 * KIB


def test_a_step_costs_the_probe_s_row_divided_by_its_steps_rounded_up() -> None:
    assert MemoryProfile(7, 1000).per_step(128) == MemoryProfile(7, 8)
    assert MemoryProfile(7, 1024).per_step(128) == MemoryProfile(7, 8)
    assert MemoryProfile(7, 1000).per_step(1) == MemoryProfile(7, 1000)


def test_a_warm_up_sample_s_length_sets_the_cost_of_a_step_not_the_steps() -> None:
    """A probe that repeated a 16-token warm-up sample measured rows of 16 steps: each step
    costs an eighth of a 128-step row's, and a batch still holds 8 rows of 128."""
    profile = MemoryProfile(10 * MIB, 128 * KIB)
    held = ModelReservations.from_config(_sequence_config()).reserve(
        DeviceBudget(CPU, GIB), profile, steps_per_row=16
    )
    assert (held.batch_cap, held.batch_steps) == (8, 1024)
    assert held.nbytes == 10 * MIB + 1024 * 8 * KIB


def test_free_axes_are_probed_at_an_image_s_size_and_smaller_in_volumes() -> None:
    def probed(*inputs: list[int]) -> int:
        config = ModelConfig(name="m", max_batch_size=8)
        for index, dims in enumerate(inputs):
            config.input.add(name=f"x{index}", dims=dims)
        return probe_length(config)

    assert probed([3, -1, -1]) == probed([-1]) == probed([4]) == PROBE_SEQUENCE_LENGTH
    assert probed([-1, -1, -1], [-1]) == 25  # 25**3 = 15,625: at most 128 x 128 a row
    assert probed([-1, -1, -1, -1]) == 11


def _image_config(dims: list[int], data_type: int = TYPE_FP32, extra: int = 0) -> ModelConfig:
    config = ModelConfig(name="cnn", max_batch_size=64)
    config.input.add(name="image", data_type=data_type, dims=dims)
    config.batchserve.max_batch_steps = extra
    return config


def test_an_image_model_is_counted_in_pixels_where_its_memory_amplifies_its_requests() -> None:
    """A FP32 pixel of three channels carries 12 bytes: counted in positions when the probe's
    row of 128 x 128 pixels cost more than 8 times that."""
    steps = StepBudget.from_config(_image_config([3, -1, -1]))
    assert steps == StepBudget(128 * 128, 64 * 128 * 128, request_bytes=12)
    row = 12 * 128 * 128
    assert steps.counts(MemoryProfile(0, AMPLIFICATION_COUNTED * row + 1))
    assert not steps.counts(MemoryProfile(0, AMPLIFICATION_COUNTED * row))
    configured = StepBudget.from_config(_image_config([3, -1, -1], extra=5000))
    assert configured == StepBudget(128 * 128, 5000)  # asked for: always counted
    assert configured.counts(MemoryProfile(0, 1))
    assert StepBudget.from_config(_image_config([-1, -1, -1])) == StepBudget(
        25**3, 64 * 25**3, request_bytes=4
    )
    assert StepBudget.from_config(_image_config([-1], TYPE_STRING)) is None  # bytes unknown
    assert StepBudget.from_config(_image_config([3, 224, 224])) is None  # no free axis


def test_an_amplifying_image_model_reserves_pixels_and_another_rows() -> None:
    budget = DeviceBudget(CPU, 64 * GIB)
    reservations = ModelReservations.from_config(_image_config([3, -1, -1]))
    amplified = MemoryProfile(MIB, 5 * MIB)  # a probe row cost 5 MiB: 27 times its bytes
    held = reservations.reserve(budget, amplified)
    assert (held.batch_cap, held.batch_steps) == (64, 64 * 128 * 128)
    assert held.nbytes == MIB + 64 * 5 * MIB
    plain = reservations.reserve(budget, MemoryProfile(MIB, 3 * 12 * 128 * 128))
    assert (plain.batch_cap, plain.batch_steps) == (64, 0)


def test_a_batch_holds_the_fewest_positions_of_the_instances_that_count_them() -> None:
    assert fewest_positions([0, 5000, 3000]) == 3000  # the 0 instance measured below 8x
    assert fewest_positions([0, 0]) == 0
    assert fewest_positions([]) == 0


def _lender(budget: DeviceBudget, positions: int = 1000, position_bytes: int = KIB) -> Reservation:
    """An instance reserving ``positions`` at ``position_bytes`` each (and 1 MiB fixed)."""
    steps = StepBudget(per_row=100, most=positions)
    return budget.reserve("cnn", MemoryProfile(MIB, 100 * position_bytes), 8, steps=steps)


def test_a_reservation_in_positions_lends_what_a_larger_batch_needs_beyond_it() -> None:
    budget = DeviceBudget(CPU, 10 * MIB)
    held = _lender(budget)
    assert (held.batch_steps, held.position_bytes) == (1000, KIB)
    assert held.extra_bytes(1000) == 0
    assert held.borrow(1000) is None  # within the reservation: nothing to borrow
    assert held.extra_bytes(1500) == 500 * KIB
    loan = held.borrow(1500)
    assert loan is not None
    assert loan.nbytes == 500 * KIB
    assert budget.available() == budget.unreserved() - 500 * KIB  # a load cannot take it
    assert budget.lent_bytes == 500 * KIB
    loan.close()
    loan.close()  # twice is harmless
    assert budget.lent_bytes == 0
    rows = budget.reserve("digits", MemoryProfile(MIB, KIB), 8)
    assert rows.extra_bytes(10**9) == 0  # counted in rows: never borrows


def test_a_loan_the_unreserved_memory_cannot_hold_is_refused_and_admission_says_so() -> None:
    budget = DeviceBudget(CPU, 4 * MIB)
    held = _lender(budget)  # 1 MiB + 1000 KiB reserved: about 2 MiB unreserved
    unreserved = budget.unreserved()
    fits = 1000 + unreserved // KIB
    assert held.could_lend(fits)
    assert not held.could_lend(fits + 1)
    with pytest.raises(Unavailable, match=r"model 'cnn' needs 2\.0 MiB beyond its reservation"):
        held.borrow(fits + 1)
    assert budget.lent_bytes == 0


def test_a_loan_waits_while_other_loans_hold_what_it_needs() -> None:
    budget = DeviceBudget(CPU, 4 * MIB)
    held = _lender(budget)
    most = 1000 + budget.unreserved() // KIB
    first = held.borrow(most)
    assert first is not None
    taken: list[Loan | None] = []
    waiting = threading.Thread(target=lambda: taken.append(held.borrow(most)))
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive()
    assert not taken
    first.close()
    waiting.join(5)
    assert taken
    assert taken[0] is not None
    assert budget.lent_bytes == taken[0].nbytes
    taken[0].close()


def test_a_loan_is_refused_when_a_load_took_the_memory_after_admission() -> None:
    budget = DeviceBudget(CPU, 4 * MIB)
    held = _lender(budget)
    most = 1000 + budget.unreserved() // KIB
    assert held.could_lend(most)  # admitted
    budget.reserve("other", MemoryProfile(MIB, 0), 1)  # then a model loads
    with pytest.raises(Unavailable, match="is unreserved now; retry later"):
        held.borrow(most)
    assert held.borrow(most - 1024) is not None  # what is still unreserved is lent
