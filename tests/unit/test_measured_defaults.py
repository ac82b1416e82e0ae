"""Instances and threads chosen by measurement at load (``models/measured_defaults.py``).

The choice is judged on backends whose cost is known: each run sleeps for its rows times a
cost per row over the square root of its threads (threads inside one session scale worse
than sessions side by side, as ONNX Runtime's do on a CNN), so a setting's throughput is set
by the test and the measured figures only have to rank settings 1.4x apart or more, far
beyond scheduling noise.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from batchserve.core.device import CPU, Device
from batchserve.core.errors import BatchserveError, ModelConfigError
from batchserve.core.signature import ModelSignature
from batchserve.models import measured_defaults
from batchserve.models.measured_defaults import (
    DEFAULT,
    MARGIN,
    Setting,
    Subject,
    Trial,
    candidates,
    configured,
    decide,
    prior,
    tune,
    wants_tuning,
)
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup

from tests.unit.fakes import fake_config

GPU = Device("gpu", 0)
RUNTIME_THREADS = 4
"""What the runtime takes when the config names no thread count (its cores)."""


BAR_NS = 1e6
"""The light bar these tests hold fixed (a fast host's is about 2 ms), so that the sleeps
of ``CostedBackend`` fall on the same side of it on any host; the bar's own timing is tested
apart."""
TIMED_BAR = measured_defaults.light_sample_ns
"""The bar as the load times it, which the fixture below replaces."""


@pytest.fixture(autouse=True)
def short_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measured_defaults, "ROUND_S", 0.03)
    monkeypatch.setattr(measured_defaults, "light_sample_ns", lambda: BAR_NS)


class CostedBackend:
    """Sleeps ``row_s / sqrt(threads)`` per row (threads from the config it was loaded with,
    else ``RUNTIME_THREADS``); records where it was loaded, run and unloaded."""

    def __init__(
        self, row_s: float, log: list[tuple[str, int, str]], fail_graphs: bool, gpu_run_s: float
    ) -> None:
        self.row_s = row_s
        self.log = log
        self.fail_graphs = fail_graphs
        self.gpu_run_s = gpu_run_s
        self.threads = 1
        self._device = CPU

    @property
    def device(self) -> Device:
        return self._device

    @property
    def signature(self) -> ModelSignature:
        raise NotImplementedError

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        if self.fail_graphs and config.optimization.cuda.graphs:
            raise ModelConfigError("this graph cannot be captured")
        parameter = config.parameters.get("intra_op_thread_count")
        self.threads = int(parameter.string_value) if parameter else RUNTIME_THREADS
        self._device = device
        self.log.append(
            ("load", threading.get_ident(), parameter.string_value if parameter else "")
        )

    def infer(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        rows = len(inputs["x"])
        self.log.append(("infer", threading.get_ident(), str(rows)))
        if self._device.kind == "gpu":  # a fixed cost to move and launch, little per row
            time.sleep(self.gpu_run_s + rows * self.row_s / 10)
        else:
            time.sleep(rows * self.row_s / math.sqrt(self.threads))
        return {}

    def memory_bytes(self) -> int | None:
        return None

    def release_after_next_run(self) -> None:
        pass

    def interrupt(self) -> None:
        pass

    def unload(self) -> None:
        self.log.append(("unload", threading.get_ident(), ""))


def subject(
    row_s: float,
    log: list[tuple[str, int, str]],
    *,
    device: Device = CPU,
    fail_graphs: bool = False,
    gpu_run_s: float = 0.0,
    extra: str = "",
) -> Subject:
    config = fake_config(extra, max_batch_size=16)

    def factory(config: ModelConfig, model_file: Path) -> CostedBackend:
        return CostedBackend(row_s, log, fail_graphs, gpu_run_s)

    def batch(rows: int) -> dict[str, np.ndarray]:
        return {"x": np.zeros((rows, 4), np.float32)}

    return Subject(config, Path("model.onnx"), device, factory, batch)


@pytest.fixture
def log() -> Iterator[list[tuple[str, int, str]]]:
    entries: list[tuple[str, int, str]] = []
    yield entries
    loads = [e for e in entries if e[0] == "load"]
    unloads = [e for e in entries if e[0] == "unload"]
    assert len(loads) == len(unloads), "every backend measured is unloaded"


# which configs are measured ---------------------------------------------------------------
def test_a_config_that_sets_nothing_is_measured() -> None:
    assert wants_tuning(fake_config())
    assert wants_tuning(fake_config("instance_group [{ kind: KIND_CPU }]"))


@pytest.mark.parametrize(
    "extra",
    [
        "instance_group [{ count: 1 }]",
        "instance_group [{ kind: KIND_CPU }, { kind: KIND_GPU }]",
        'parameters { key: "intra_op_thread_count" value { string_value: "2" } }',
        'parameters { key: "inter_op_thread_count" value { string_value: "1" } }',
        'parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "2" } }',
        'parameters { key: "INTER_OP_THREAD_COUNT" value { string_value: "1" } }',
        "model_transaction_policy { decoupled: true }",
    ],
)
def test_a_config_that_chose_is_left_alone(extra: str) -> None:
    assert not wants_tuning(fake_config(extra))


def test_sequence_models_keep_their_instances() -> None:
    config = fake_config(batching=False)
    config.sequence_batching.SetInParent()
    assert not wants_tuning(config)


# what is measured and how the choice is written --------------------------------------------
def test_cpu_candidates_are_the_default_then_one_thread_per_core_then_halves() -> None:
    assert candidates(CPU, 1, False) == [DEFAULT]
    assert candidates(CPU, 2, False) == [DEFAULT, Setting(2, 1)]
    assert candidates(CPU, 8, True) == [DEFAULT, Setting(8, 1), Setting(2, 4)]


def test_gpu_candidates_add_an_instance_and_cuda_graphs_where_they_can_run() -> None:
    assert candidates(GPU, 16, False) == [DEFAULT, Setting(2)]
    assert candidates(GPU, 16, True) == [
        DEFAULT,
        Setting(2),
        Setting(cuda_graphs=True),
        Setting(2, cuda_graphs=True),
    ]


def test_the_chosen_setting_is_written_as_an_author_would_write_it() -> None:
    config = fake_config()
    written = configured(config, Setting(4, 1))
    assert [(g.count, g.kind) for g in written.instance_group] == [(4, 0)]
    assert written.parameters["intra_op_thread_count"].string_value == "1"
    assert not written.optimization.cuda.graphs
    assert configured(config, DEFAULT) == config
    assert not config.instance_group, "the original is not changed"
    graphs = configured(
        fake_config("instance_group [{ kind: KIND_GPU }]"), Setting(2, cuda_graphs=True)
    )
    assert [(g.count, g.kind) for g in graphs.instance_group] == [(2, 1)]
    assert graphs.optimization.cuda.graphs
    assert "intra_op_thread_count" not in graphs.parameters


def test_the_expected_setting_stays_unless_another_beats_it_by_the_margin() -> None:
    per_core = Setting(2, 1)
    near = [Trial(DEFAULT, (100.0 * (1 + MARGIN / 2),)), Trial(per_core, (100.0,))]
    chosen, reason = decide(near, per_core)
    assert chosen == per_core, "noise between the two keeps the expected winner"
    assert reason.startswith(f"{1 / (1 + MARGIN / 2):.2f}x the default's throughput")
    far = [Trial(DEFAULT, (150.0, 10.0, 160.0)), Trial(per_core, (100.0, 90.0, 110.0))]
    chosen, reason = decide(far, per_core)
    assert chosen == DEFAULT, "the median of the rounds, not one slow round, decides"
    assert "1.00x" in reason
    assert "faster than 2 instance(s) x 1 thread(s)" in reason
    failed = [Trial(DEFAULT, (100.0,)), Trial(Setting(2), (), "out of memory")]
    assert decide(failed, Setting(2))[0] == DEFAULT, "an expected setting that failed is not it"
    gpu = [Trial(DEFAULT, (100.0,)), Trial(Setting(2), (104.0,)), Trial(Setting(3), (130.0,))]
    chosen, reason = decide(gpu)
    assert chosen == Setting(3)
    assert reason.startswith("1.30x the default's throughput")


def test_one_single_thread_instance_per_core_is_expected_on_a_cpu_only() -> None:
    assert prior(CPU, 8) == Setting(8, 1)
    assert prior(CPU, 1) == DEFAULT
    assert prior(GPU, 8) == DEFAULT


# measuring real (costed) backends -----------------------------------------------------------
def test_a_light_model_keeps_the_default_after_one_round(log: list[tuple[str, int, str]]) -> None:
    tuning = tune(subject(0.0, log), cores=2)
    assert tuning.chosen == DEFAULT
    assert "request handling dominates" in tuning.reason
    assert [t.setting for t in tuning.trials] == [DEFAULT]
    assert len([e for e in log if e[0] == "load"]) == 1, "no other candidate was loaded"


def test_the_light_bar_is_the_fastest_timing_of_the_loop_scaled_to_its_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(measured_defaults, "light_sample_ns", TIMED_BAR)
    timings = iter([0.006, 0.002, 0.004])  # seconds for TIMED_LOOP_STEPS; the middle one fastest
    monkeypatch.setattr(measured_defaults, "loop_seconds", lambda steps: next(timings))
    per_step_ns = 0.002 * 1e9 / measured_defaults.TIMED_LOOP_STEPS
    assert measured_defaults.light_sample_ns() == pytest.approx(
        per_step_ns * measured_defaults.LIGHT_LOOP_STEPS
    )


@pytest.mark.parametrize(("loop_s", "light"), [(0.0005, False), (0.004, True)])
def test_the_same_model_is_light_on_a_host_that_runs_python_slowly(
    monkeypatch: pytest.MonkeyPatch, log: list[tuple[str, int, str]], loop_s: float, light: bool
) -> None:
    # 4 ms a row on 4 runtime threads: 2 ms a sample. A loop of 20,000 steps in 0.5 ms sets
    # the bar at 1.75 ms (heavy); in 4 ms, a host eight times slower, at 14 ms (light).
    monkeypatch.setattr(measured_defaults, "light_sample_ns", TIMED_BAR)
    monkeypatch.setattr(measured_defaults, "TIMED_LOOP_STEPS", 20_000)
    monkeypatch.setattr(measured_defaults, "loop_seconds", lambda steps: loop_s)
    tuning = tune(subject(0.004, log), cores=2)
    assert ("request handling dominates" in tuning.reason) is light
    assert (len(tuning.trials) == 1) is light, tuning


class SlowRunsBackend(CostedBackend):
    """A ``CostedBackend`` whose runs, counted from 1, may each take ``extra_s`` longer."""

    def __init__(self, row_s: float, log: list[tuple[str, int, str]]) -> None:
        super().__init__(row_s, log, fail_graphs=False, gpu_run_s=0.0)
        self.runs = 0

    def extra_s(self, run: int, rows: int) -> float:
        raise NotImplementedError

    def infer(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        self.runs += 1
        time.sleep(self.extra_s(self.runs, len(inputs["x"])))
        return super().infer(inputs, output_names)


class StallBackend(SlowRunsBackend):
    """A light backend whose first timed run stalls, as a run does while the host stalls."""

    STALL_S = 0.08

    def extra_s(self, run: int, rows: int) -> float:
        return self.STALL_S if run == measured_defaults.WARM_RUNS + 1 else 0.0


def test_a_light_model_is_known_despite_a_stall_in_its_first_round(
    log: list[tuple[str, int, str]],
) -> None:
    stalled = replace(subject(0.0, log), factory=lambda *_: StallBackend(0.0, log))
    tuning = tune(stalled, cores=2)
    assert 16 / StallBackend.STALL_S * BAR_NS < 1e9, "it looks heavy"
    assert tuning.chosen == DEFAULT
    assert "request handling dominates" in tuning.reason
    assert [t.setting for t in tuning.trials] == [DEFAULT]
    assert tuning.trials[0].samples_per_s * BAR_NS > 1e9
    assert len([e for e in log if e[0] == "load"]) == 1, "no other candidate was loaded"


@pytest.mark.parametrize(
    ("bar_ns", "default_runs"), [(BAR_NS, measured_defaults.WARM_RUNS + 3), (BAR_NS / 20, 1)]
)
def test_only_a_model_a_stall_could_have_slowed_past_the_bar_gets_short_rounds(
    monkeypatch: pytest.MonkeyPatch,
    log: list[tuple[str, int, str]],
    bar_ns: float,
    default_runs: int,
) -> None:
    # 8 ms a row on 4 runtime threads: 4 ms a sample, 64 ms a run of 16 rows (one run a
    # short round). Four times the bar, which a stall could make of a light model: the
    # first round, after its warm-up runs, and two more. Eighty times it, which no stall
    # makes of one: its first run, untimed, and no short round
    monkeypatch.setattr(measured_defaults, "light_sample_ns", lambda: bar_ns)
    assert measured_defaults.FIRST_ROUNDS == 3
    assert measured_defaults.STALL_FACTOR == 10
    tune(subject(0.008, log), cores=2)
    second_load = [index for index, entry in enumerate(log) if entry[0] == "load"][1]
    runs = [entry for entry in log[:second_load] if entry[0] == "infer"]
    assert len(runs) == default_runs


def test_a_model_whose_runs_are_long_is_measured_on_fewer_rows(
    monkeypatch: pytest.MonkeyPatch, log: list[tuple[str, int, str]]
) -> None:
    # 4 ms a row: 16 rows take the default 32 ms on its 4 threads, twice the RUN_S set here,
    # so the rounds run 8 rows or a few fewer (sleeps run long), at least one an instance
    monkeypatch.setattr(measured_defaults, "RUN_S", 0.016)
    tuning = tune(subject(0.004, log), cores=4)
    loads = [index for index, entry in enumerate(log) if entry[0] == "load"]
    default_thread = log[loads[0]][1]
    rows = {
        int(r)
        for kind, thread, r in log[loads[1] :]
        if kind == "infer" and thread == default_thread
    }
    (measured_rows,) = rows
    assert 4 <= measured_rows <= 8, log
    assert tuning.chosen == Setting(4, 1), tuning
    default, per_core, _ = tuning.trials
    assert len(default.rounds) == len(per_core.rounds), "the first round ran 16 rows: not counted"
    assert per_core.samples_per_s > 1.5 * default.samples_per_s


def test_one_thread_per_core_wins_where_instances_scale(log: list[tuple[str, int, str]]) -> None:
    # 16 rows: the default (4 threads) takes 8 row-times, four one-thread instances 4 each
    # side by side, two two-thread instances 8 rows / 1.41 = 5.7 each.
    tuning = tune(subject(0.004, log), cores=4)
    assert tuning.chosen == Setting(4, 1), tuning
    assert [t.setting for t in tuning.trials] == [DEFAULT, Setting(4, 1), Setting(2, 2)]
    default, per_core, halves = (t.samples_per_s for t in tuning.trials)
    assert per_core > 1.5 * default
    assert per_core > halves > default
    assert all(len(t.rounds) >= 2 for t in tuning.trials), "rounds are interleaved"


class RampBackend(SlowRunsBackend):
    """A ``CostedBackend`` whose first two runs cost thirty times its later ones, as a CNN's
    first runs on ONNX Runtime cost more while its memory is still growing. Thirty, so that
    a round that timed one (at about 1/30 of the others' rate) stands far apart from a round
    slowed by a loaded host (seen at 1/2.2 on a two-core CI runner)."""

    RAMP_RUNS, RAMP_COST = 2, 30

    def extra_s(self, run: int, rows: int) -> float:
        if run > self.RAMP_RUNS:
            return 0.0
        return (self.RAMP_COST - 1) * rows * self.row_s / math.sqrt(self.threads)


def test_no_candidate_is_timed_before_its_first_runs_are_over(
    log: list[tuple[str, int, str]],
) -> None:
    ramped = replace(subject(0.004, log), factory=lambda *_: RampBackend(0.004, log))
    tuning = tune(ramped, cores=2)
    assert measured_defaults.WARM_RUNS > RampBackend.RAMP_RUNS
    for trial in tuning.trials:
        assert min(trial.rounds) > max(trial.rounds) * 4 / RampBackend.RAMP_COST, trial


def _instances_of(costs: Sequence[CostedBackend]) -> Callable[..., CostedBackend]:
    """A factory handing out ``costs`` in turn: the default's backend, then each instance's."""
    made = iter(costs)
    return lambda *_: next(made)


def test_a_round_lasts_each_run_s_slowest_part_as_a_split_batch_does(
    log: list[tuple[str, int, str]],
) -> None:
    # Two single-thread instances, one three times as slow: 8 rows take 16 and 48 ms. Run in
    # step, as the batcher runs the two halves of a batch, 16 rows take 48 ms: 333/s at most
    # (a sleep runs long, never short). Each running on to its own deadline over a 30 ms
    # round, the fast one made two runs to the slow one's one, and the round counted 24 rows
    # in 48 ms: 500/s.
    backends = [CostedBackend(0.002, log, False, 0.0) for _ in range(3)]
    backends[2].row_s = 0.006
    tuning = tune(replace(subject(0.002, log), factory=_instances_of(backends)), cores=2)
    _, split = tuning.trials
    assert split.setting == Setting(2, 1)
    assert max(split.rounds) <= 16 / 0.048, split


def test_gpu_instances_are_timed_each_on_its_own_as_each_takes_whole_batches(
    log: list[tuple[str, int, str]],
) -> None:
    # Two GPU instances, runs of 10 and 30 ms whatever the rows: the batcher gives each whole
    # batches, so together they run 8 rows every 10 ms and 8 every 30 ms, 1,067/s; in step,
    # 16 rows every 30 ms would be 533/s. The median, the figure the choice is made on: one
    # round slowed by a loaded host may fall below the bar.
    backends = [CostedBackend(0.0, log, False, run_s) for run_s in (0.01, 0.01, 0.03)]
    named = "instance_group [{ kind: KIND_GPU }]"
    gpu = replace(subject(0.0, log, device=GPU, extra=named), factory=_instances_of(backends))
    tuning = tune(gpu, cores=2)
    _, two = tuning.trials
    assert two.setting == Setting(2)
    assert two.samples_per_s > 1.4 * 16 / 0.03, two


class _FailsOnRun(CostedBackend):
    def __init__(self, log: list[tuple[str, int, str]], failing_run: int) -> None:
        super().__init__(0.002, log, fail_graphs=False, gpu_run_s=0.0)
        self.failing_run = failing_run
        self.runs = 0

    def infer(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        self.runs += 1
        if self.runs == self.failing_run:
            raise BatchserveError("instance 2 ran out of memory")
        return super().infer(inputs, output_names)


@pytest.mark.parametrize("failing_run", [2, measured_defaults.WARM_RUNS + 1])
def test_an_instance_that_fails_mid_round_ends_it_with_its_own_error(
    log: list[tuple[str, int, str]], failing_run: int
) -> None:
    """A warm-up run (2) or a timed one fails on one instance: the other must not wait for
    it at the start of the next run, and the error is the instance's, not the barrier's."""
    backends = [CostedBackend(0.002, log, False, 0.0) for _ in range(2)]
    backends.append(_FailsOnRun(log, failing_run))
    failing = replace(subject(0.002, log), factory=_instances_of(backends))
    outcome: list[BaseException] = []

    def measure() -> None:
        try:
            tune(failing, cores=2)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=measure, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the round waits for an instance that failed"
    (error,) = outcome
    assert isinstance(error, BatchserveError)
    assert error.message == "instance 2 ran out of memory"


def test_each_instance_loads_runs_and_unloads_on_its_own_thread(
    log: list[tuple[str, int, str]],
) -> None:
    tune(subject(0.004, log), cores=2)
    loads = [(thread, threads) for kind, thread, threads in log if kind == "load"]
    assert sorted(threads for _, threads in loads) == ["", "1", "1"], "runtime's, then 1 each"
    runs = {thread for kind, thread, _ in log if kind == "infer"}
    unloads = {thread for kind, thread, _ in log if kind == "unload"}
    assert {thread for thread, _ in loads} == runs == unloads
    assert len(runs) == 3
    rows = {int(rows) for kind, _, rows in log if kind == "infer"}
    assert rows == {16, 8}, "the default runs 16 rows, each of two instances 8"


def test_a_candidate_that_cannot_load_is_reported_not_chosen(
    log: list[tuple[str, int, str]],
) -> None:
    tuning = tune(subject(0.001, log, device=GPU, fail_graphs=True), cores=2, graphs_possible=True)
    failed = {t.setting: t.error for t in tuning.trials if not t.rounds}
    assert failed == {
        Setting(cuda_graphs=True): "this graph cannot be captured",
        Setting(2, cuda_graphs=True): "this graph cannot be captured",
    }
    assert not tuning.chosen.cuda_graphs


def test_an_error_that_is_not_the_models_fault_still_unloads_what_was_loaded(
    log: list[tuple[str, int, str]],
) -> None:
    def broken(rows: int) -> dict[str, np.ndarray]:
        raise BatchserveError("inputs could not be made")

    costed = subject(0.004, log)
    with pytest.raises(BatchserveError, match="inputs could not be made"):
        tune(Subject(costed.config, costed.model_file, CPU, costed.factory, broken), cores=2)


def test_kind_auto_on_a_gpu_adds_a_cpu_instance_where_the_cpu_runs_one_sample_faster(
    log: list[tuple[str, int, str]],
) -> None:
    # One sample: 2 ms on the CPU, 10 ms on the GPU (moving it there and back); sixteen:
    # 32 ms on the CPU, 13 ms on the GPU.
    tuning = tune(subject(0.002, log, device=GPU, gpu_run_s=0.01), cores=2)
    assert tuning.chosen.cpu_instances == 1, tuning.reason
    assert "a CPU instance takes the batches under the crossover" in tuning.reason
    written = configured(fake_config(), tuning.chosen)
    kinds = [(g.kind, g.count) for g in written.instance_group]
    assert kinds[-1] == (ModelInstanceGroup.KIND_CPU, 1)
    assert len(kinds) == 2
    assert written.instance_group[-1].name == f"{written.name}_1"  # Triton's name for it


def test_a_gpu_faster_at_one_sample_keeps_every_batch(log: list[tuple[str, int, str]]) -> None:
    tuning = tune(subject(0.002, log, device=GPU, gpu_run_s=0.0), cores=2)
    assert tuning.chosen.cpu_instances == 0
    assert "every batch runs on the GPU" in tuning.reason


def test_a_config_that_names_the_gpu_is_not_given_cpu_instances(
    log: list[tuple[str, int, str]],
) -> None:
    named = subject(
        0.002, log, device=GPU, gpu_run_s=0.01, extra="instance_group [{ kind: KIND_GPU }]"
    )
    tuning = tune(named, cores=2)
    assert tuning.chosen.cpu_instances == 0
    assert "CPU" not in tuning.reason


class FixedCostBackend(CostedBackend):
    """Takes ``run_s`` a run whatever its rows, as a model with a long fixed cost does."""

    def __init__(self, run_s: float, log: list[tuple[str, int, str]]) -> None:
        super().__init__(0.0, log, False, 0.0)
        self.run_s = run_s

    def infer(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        self.log.append(("infer", threading.get_ident(), str(len(inputs["x"]))))
        time.sleep(self.run_s)
        return {}


def test_a_model_whose_runs_stay_long_on_fewer_rows_keeps_the_default_without_rounds(
    monkeypatch: pytest.MonkeyPatch, log: list[tuple[str, int, str]]
) -> None:
    """A run of 0.3 s whatever its rows: four runs of each of two settings would take 2.4 s,
    past the (here) 1 s a load may measure, so it stops after two runs of the default (a
    4 s-a-run model spent 35-41 s of its load measuring)."""
    monkeypatch.setattr(measured_defaults, "TIME_LIMIT_S", 1.0)
    base = subject(0.0, log)
    slow = replace(base, factory=lambda config, model_file: FixedCostBackend(0.3, log))
    started = time.perf_counter()
    tuning = tune(slow, cores=2)
    assert time.perf_counter() - started < 1.0
    assert tuning.chosen == DEFAULT
    assert tuning.trials == ()
    assert "took 0.3 s: measuring would take about 2 s, past the 1 s a load may spend" in (
        tuning.reason
    )
    assert [entry[0] for entry in log].count("load") == 1  # no other setting was loaded
    assert [entry[0] for entry in log].count("infer") == 2


def test_a_long_run_that_fewer_rows_shorten_is_still_measured(
    monkeypatch: pytest.MonkeyPatch, log: list[tuple[str, int, str]]
) -> None:
    monkeypatch.setattr(measured_defaults, "TIME_LIMIT_S", 1.0)
    monkeypatch.setattr(measured_defaults, "RUN_S", 0.016)
    tuning = tune(subject(0.004, log), cores=2)  # 16 rows: 32 ms; 4 rows: 8 ms
    assert tuning.trials  # measured
