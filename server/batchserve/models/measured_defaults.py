"""Instance count and threads chosen by measurement at load, for configs that set neither.

A config without an instance count or thread parameters used to get one instance on the
runtime's own thread pool. For a compute-bound CNN on a CPU that reached 0.89-0.91 of the
model's in-process throughput, where one single-threaded instance per core reaches about
1.0 (``bench/NOTES.md``); for a light model more instances buy nothing, since handling its
requests costs more than running it, and each batch split across instances pays its
hand-over twice. So the load measures instead of guessing:

- the default (one instance, the runtime's threads) runs first; a model whose sample costs
  less than ``LIGHT_LOOP_STEPS`` steps of a Python loop timed on the spot, in one of its
  first short rounds, keeps it, after a fraction of a second; a model whose first run alone
  shows it far dearer skips those rounds;
- otherwise each candidate (``candidates``: on a CPU one instance per core with one thread,
  and splits between; on a GPU two instances, and CUDA graphs) runs the same rows
  concurrently on all its instances, in interleaved rounds so that a machine whose speed
  drifts favours none, bounded by ``TIME_LIMIT_S``; on a CPU a model whose run takes longer
  than ``RUN_S`` runs fewer rows, so that a heavy CNN is measured in seconds;
- the expected winner (``prior``: on a CPU one single-thread instance per core, what every
  measurement of a compute-bound CNN here found best; on a GPU the default) stays unless
  another setting measures ``MARGIN`` faster: on a 2-core machine two settings a few per
  cent apart swap places from one round to the next, and the rule then keeps what the
  served benchmarks found best instead of whichever won the last round.

The choice and every figure are logged and shown in the model's statistics. A config opts
out by setting an instance ``count`` or a thread parameter. A PyTorch program on a CPU keeps
the default unmeasured: torch has one pool of threads per process, so its instances cannot
have threads of their own (``ONE_POOL``).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from batchserve.backends.base import Arrays, Backend
from batchserve.backends.selection import IDENTITY, PT2, runtime_name
from batchserve.backends.torch_threads import PARAMETERS as TORCH_THREAD_PARAMETERS
from batchserve.core.device import CPU, Device
from batchserve.core.errors import BatchserveError
from batchserve.core.python_speed import loop_seconds
from batchserve.devices.placement import group_name, places_auto
from batchserve.models.measuring_gate import MEASURING
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup

logger = logging.getLogger(__name__)

THREAD_PARAMETERS = ("intra_op_thread_count", "inter_op_thread_count", *TORCH_THREAD_PARAMETERS)
"""Config parameters that set a runtime's threads, by Triton's names (ONNX Runtime's per
instance, torch's per process): a config with one has chosen."""
ONE_POOL = (
    "torch's CPU threads are one pool per process (INTRA_OP_THREAD_COUNT), not one per "
    "instance: one instance on that pool"
)
"""Why a PyTorch program on a CPU is not measured: the settings worth measuring there give
each instance threads of its own (``backends/torch_threads.py``)."""
LIGHT_LOOP_STEPS = 70_000
"""A sample cheaper than this many steps of a bare Python loop, timed by the same load
(``core/python_speed.py``), is not compute-bound in a server: receiving, batching and
answering its request is Python on the same cores (67-180 µs of request handling on the
2-core reference machine, more for the batch's hand-overs), which the measuring, the model
alone, does not see. char_lstm at 128 steps measured 1.4x faster alone with two single-thread
instances, and served at 0.56-0.77x the default with them: each batch split in two, the
halves' hand-overs and the event loop on the same two cores. In five loads on the reference
machine the load timed the loop at 28-31 ns a step, char_lstm at 0.50-0.92 ms a sample and
the test suite's compute-bound dense_stack at 4.9-5.1 ms: the bar, 2.0-2.2 ms there, sits at
least 2.2x from each. It was a fixed 1 ms, and CI failed once on a day its host ran char_lstm
at 0.9 ms: that host's loop has taken 0.24-1.41 s for 10 million steps on different days,
and request handling slows with it."""
TIMED_LOOP_STEPS = 20_000
"""Steps of each timing of the loop: 0.5-3 ms on the reference machine."""
MARGIN = 0.10
"""How much faster than the expected winner another setting must measure to replace it. At
5 % mobilenetish's loads on the 2-core reference machine chose the default (one instance on
the runtime's threads) 2 times in 14: the default measured 0.85-1.01x the prior in the
others, so the load's figures spread by about 8 %; served at gRPC c=16 the default then
answered 72-81/s where the prior answered 82-96/s."""
FIRST_ROUND_S = 0.05
"""The default's first round, which tells a light model (most models a test suite loads)
and ends its measuring."""
FIRST_ROUNDS = 3
"""Short rounds, at most, of which the fastest tells a light model: one round can run
several times slower while the host stalls, and char_lstm, whose sample cost 0.5-0.9 ms on a
host that runs ONNX Runtime slowly, was then measured as a compute-bound model (seen once in
CI). A model none of them finds light pays 0.1 s more."""
STALL_FACTOR = 10
"""How many times the light bar a first round may measure and still get the further short
rounds, and the default's first, untimed run and still get the first round: a stall makes a
run several times slower, not tens of times, and so does a first run's ramp (below). A
ResNet-50-like CNN (68 ms a sample on the 2-core reference machine, 34 times the bar) spent
2.2 s of its 13.6 s of measuring on two more rounds that could not have found it light, and
then 3.2 s on a first round of four runs of 16 rows that could not either."""
ROUND_S = 0.25
"""Each candidate's share of one round."""
RUN_S = 0.1
"""Longest a run of the measured rows should take on a CPU: a model whose run takes longer
is measured on fewer rows (down to one an instance), so that a round holds a few runs and
the warm-up runs cost little. A ResNet-50-like CNN ran 16 rows in 0.75-0.86 s on the 2-core
reference machine, and its measuring took 8.4-9.7 s, of which 7 s were its candidates' warm-up
runs and rounds of one run each; its samples per second at 2, 4, 8 and 16 rows differed by
less than from one round to the next (18-21/s for both settings; a VGG-like CNN 41-48/s),
as a CNN's do on a CPU, where a batch costs its rows times a sample. On a GPU throughput
comes from large batches, and its rows stay."""
ROUNDS = 5
"""Rounds each candidate runs, at most: a round on the 2-core reference machine measured a
VGG-like CNN 25 % slower than the round before it on some loads (27.5-37.9/s for one
setting), and with three rounds the median still differed by 10 % between two settings that
measure the same over longer runs (the load chose the default once in seven)."""
TIME_LIMIT_S = 8.0
"""Most a load spends measuring (rounds stop once it is reached; the first always runs)."""
WARM_RUNS = 3
"""Untimed runs before a candidate's first timed round (none before later ones): on the 2-core
reference machine a CNN's first two or three runs of 16 rows in a new session ran 15-70 %
slower than later ones, and with one untimed run a round, a candidate's first round was
timed on that ramp while the default, which had run more often by then, was past it."""
MEASURED_ROWS = 16
"""Rows a candidate runs at once, split across its instances as the batcher splits a CPU
batch: the batch a model sees from 16 concurrent clients."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One way to run a model: instances, threads each (0: the runtime's own choice),
    whether GPU batches run as captured CUDA graphs, and CPU instances beside GPU ones
    (``KIND_AUTO`` on a GPU machine, for the batches a CPU runs faster: ``routing.py``)."""

    instances: int = 1
    threads: int = 0
    cuda_graphs: bool = False
    cpu_instances: int = 0

    def __str__(self) -> str:
        threads = f"{self.threads} thread(s)" if self.threads else "runtime threads"
        graphs = ", CUDA graphs" if self.cuda_graphs else ""
        cpu = f", {self.cpu_instances} CPU instance(s) beside" if self.cpu_instances else ""
        return f"{self.instances} instance(s) x {threads}{graphs}{cpu}"


DEFAULT = Setting()
"""What a config without a count or thread parameters got before measurement."""


@dataclass(frozen=True, slots=True)
class Trial:
    """A setting as measured: samples per second in each round (empty: it failed to load)."""

    setting: Setting
    rounds: tuple[float, ...]
    error: str = ""

    @property
    def samples_per_s(self) -> float:
        return statistics.median(self.rounds) if self.rounds else 0.0


@dataclass(frozen=True, slots=True)
class Tuning:
    """What the load chose, why, and what it measured."""

    chosen: Setting
    reason: str
    trials: tuple[Trial, ...]
    seconds: float


def wants_tuning(config: ModelConfig) -> bool:
    """Whether a config leaves instances and threads to the server: no count, no thread
    parameter, at most one instance group, and a model the dynamic batcher schedules
    (sequence slots and decoupled responders are per instance by design) that computes
    something (the identity backend copies: one instance, as Triton gives it)."""
    if config.backend == IDENTITY.backend:
        return False
    if len(config.instance_group) > 1 or any(g.count for g in config.instance_group):
        return False
    if any(name in config.parameters for name in THREAD_PARAMETERS):
        return False
    if config.HasField("sequence_batching") or config.HasField("ensemble_scheduling"):
        return False
    return not config.model_transaction_policy.decoupled


def candidates(device: Device, cores: int, graphs_possible: bool) -> list[Setting]:
    """The settings worth measuring beside ``DEFAULT``, which always comes first."""
    if device.kind == "gpu":
        found = [DEFAULT, Setting(instances=2)]
        if graphs_possible:
            found += [Setting(cuda_graphs=True), Setting(instances=2, cuda_graphs=True)]
        return found
    found = [DEFAULT]
    if cores > 1:
        found.append(Setting(instances=cores, threads=1))
    if cores >= 4:
        found.append(Setting(instances=2, threads=cores // 2))
    return found


def configured(config: ModelConfig, setting: Setting) -> ModelConfig:
    """``config`` with ``setting`` written into it, as if its author had chosen it."""
    result = ModelConfig()
    result.CopyFrom(config)
    if setting == DEFAULT:
        return result
    if not result.instance_group:
        result.instance_group.add()
    result.instance_group[0].count = setting.instances
    if setting.threads:
        result.parameters["intra_op_thread_count"].string_value = str(setting.threads)
    if setting.cuda_graphs:
        result.optimization.cuda.graphs = True
    if setting.cpu_instances:
        added = result.instance_group.add(
            kind=ModelInstanceGroup.KIND_CPU, count=setting.cpu_instances
        )
        added.name = group_name(result, added, len(result.instance_group) - 1)
    return result


def prior(device: Device, cores: int) -> Setting:
    """The setting expected to win: on a CPU one single-thread instance per core, which every
    served measurement of a compute-bound CNN here found fastest (``bench/NOTES.md``); on a
    GPU the default, until measured otherwise."""
    return Setting(instances=cores, threads=1) if device.kind == "cpu" and cores > 1 else DEFAULT


def decide(trials: Sequence[Trial], expected: Setting = DEFAULT) -> tuple[Setting, str]:
    """``expected`` (else the default, the first trial, when it could not run) unless another
    trial measured ``MARGIN`` faster; the reason gives the choice against the default."""
    ran = [trial for trial in trials if trial.rounds]
    base = next((t for t in ran if t.setting == expected), trials[0])
    best = max(ran, key=lambda trial: trial.samples_per_s)
    chosen = best if best.samples_per_s > base.samples_per_s * (1 + MARGIN) else base
    default = trials[0].samples_per_s
    gain = f"{chosen.samples_per_s / default:.2f}x the default's throughput" if default else ""
    if chosen is base:
        return base.setting, f"{gain}; no other setting measured {MARGIN:.0%} faster"
    return chosen.setting, f"{gain}; {MARGIN:.0%} or more faster than {base.setting}"


BackendFactory = Callable[[ModelConfig, Path], Backend]
Batch = Callable[[int], Arrays]
"""Inputs of a given number of rows (``warmup.synthetic_batch`` for the model)."""


class _Round:
    """One round of a candidate, its instances started together, run as the batcher runs
    them. CPU instances take the parts of a batch it split (``Batcher._spread``): every run
    starts together, and the round lasts each run's slowest part, summed. Instances that each
    ran on to their own deadline ended a round at different times, and the span to the last
    end counted the first's idle tail: with rounds of two or three runs, that cost two
    instances up to a run's share of the round, and a VGG-like CNN's load chose the default
    twice in three for it. GPU instances each take whole batches: each runs on to its own
    deadline, and the round's rate is the sum of theirs."""

    def __init__(self, instances: int, seconds: float, in_step: bool) -> None:
        self._barrier = threading.Barrier(instances, action=self._arrived if in_step else None)
        self._seconds = seconds
        self._in_step = in_step
        self._began: float | None = None
        self._going = True
        self._runs = 0
        """Runs every instance has finished, in step."""
        self._elapsed = 0.0
        self._rates: list[float] = []
        """Each instance's samples per second, on its own."""

    def run(self, backend: Backend, inputs: Arrays, rows: int, warm: int) -> None:
        """On an instance's thread: ``warm`` untimed runs of ``inputs`` (``rows`` rows; the
        first runs allocate), then the round; a failure releases the other instances."""
        try:
            for _ in range(warm):
                backend.infer(inputs)
            if self._in_step:
                while self._next():
                    backend.infer(inputs)
                return
            self._barrier.wait()
            began, done = time.perf_counter(), 0
            while not done or time.perf_counter() - began < self._seconds:
                backend.infer(inputs)
                done += rows
            self._rates.append(done / (time.perf_counter() - began))
        except BaseException:
            self._barrier.abort()
            raise

    def samples_per_s(self, rows: int) -> float:
        """Of the whole candidate, ``rows`` being all its instances' rows of a run."""
        if self._in_step:
            return self._runs * rows / max(self._elapsed, 1e-9)
        return sum(self._rates)

    def _arrived(self) -> None:
        now = time.perf_counter()
        if self._began is None:
            self._began = now
            return
        self._runs += 1
        self._elapsed = now - self._began
        self._going = self._elapsed < self._seconds

    def _next(self) -> bool:
        self._barrier.wait()
        return self._going


class _Candidate:
    """A setting's instances, each loaded and run on a thread of its own (a GPU session and
    its stream belong to one thread)."""

    def __init__(self, setting: Setting) -> None:
        self.setting = setting
        self.backends: list[Backend] = []
        self.threads: list[ThreadPoolExecutor] = []
        self.runs: dict[int, int] = {}
        """Runs each instance has made, by rows per instance, up to ``WARM_RUNS``."""

    def load(
        self, factory: BackendFactory, config: ModelConfig, model: Path, device: Device
    ) -> None:
        variant = configured(config, self.setting)
        for index in range(self.setting.instances):
            thread = ThreadPoolExecutor(1, thread_name_prefix=f"measure-{index}")
            self.threads.append(thread)
            backend = factory(variant, model)
            thread.submit(backend.load, model, variant, device).result()
            self.backends.append(backend)

    def cold_run(self, batch: Batch, rows: int) -> float:
        """Seconds of every instance's first run of its share of ``rows``, all at once: the
        first of its warm-up runs, which tells how heavy a model is before any round."""
        rows_each = self._share(rows)
        inputs = batch(rows_each)
        started = time.perf_counter()
        runs = [thread.submit(backend.infer, inputs) for thread, backend in self._instances()]
        for run in runs:
            run.result()
        self.runs[rows_each] = self.runs.get(rows_each, 0) + 1
        return time.perf_counter() - started

    def run_round(self, batch: Batch, seconds: float, rows: int) -> float:
        """Samples per second with every instance running its share of ``rows``, all started
        together (``_Round``), for at least ``seconds`` and one run each, after the warm-up
        runs each instance has not yet made at that share."""
        rows_each = self._share(rows)
        inputs = batch(rows_each)
        in_step = all(backend.device.kind == "cpu" for backend in self.backends)
        this_round = _Round(len(self.backends), seconds, in_step)
        warm = max(0, WARM_RUNS - self.runs.get(rows_each, 0))
        self.runs[rows_each] = WARM_RUNS
        runs = [
            thread.submit(this_round.run, backend, inputs, rows_each, warm)
            for thread, backend in self._instances()
        ]
        errors = [error for error in (run.exception() for run in runs) if error is not None]
        if errors:  # the failure itself, not the broken barrier it left the others
            broken = threading.BrokenBarrierError
            raise next((e for e in errors if not isinstance(e, broken)), errors[0])
        return this_round.samples_per_s(rows_each * len(self.backends))

    def _share(self, rows: int) -> int:
        return max(1, -(-rows // len(self.backends)))

    def _instances(self) -> Iterator[tuple[ThreadPoolExecutor, Backend]]:
        return zip(self.threads, self.backends, strict=True)

    def close(self) -> None:
        for thread, backend in zip(self.threads, self.backends, strict=False):
            thread.submit(backend.unload).result()
        for thread in self.threads:
            thread.shutdown(wait=True)


@dataclass(frozen=True, slots=True)
class Subject:
    """The model being measured: its config and file, where it runs, and its inputs."""

    config: ModelConfig
    model_file: Path
    device: Device
    factory: BackendFactory
    batch: Batch


def tune(subject: Subject, cores: int, *, graphs_possible: bool = False) -> Tuning:
    """Measure the candidates for ``subject`` and choose (see the module docstring)."""
    started = time.perf_counter()
    settings = candidates(subject.device, cores, graphs_possible)
    if (
        subject.device.kind == "cpu"
        and runtime_name(subject.config, subject.model_file) == PT2.backend
    ):
        return Tuning(DEFAULT, ONE_POOL, (), 0.0)
    if len(settings) == 1:
        return Tuning(DEFAULT, "one core: nothing else to measure", (), 0.0)
    rows = _rows(subject.config, subject.device)
    with MEASURING.measuring(), ExitStack() as stack:
        default = stack.enter_context(_loaded(subject, DEFAULT))
        run_s = default.cold_run(subject.batch, rows)
        bar_ns = light_sample_ns() if subject.device.kind == "cpu" else 0.0
        first: tuple[float, ...] = ()
        if not bar_ns or run_s * 1e9 <= rows * bar_ns * STALL_FACTOR:  # it could be light
            rate = default.run_round(subject.batch, FIRST_ROUND_S, rows)
            if light := _light(default, subject.batch, rows, rate, bar_ns) if bar_ns else 0.0:
                return _light_tuning(light, bar_ns, time.perf_counter() - started)
            first, run_s = (rate,), rows / rate
        if bar_ns and run_s > RUN_S:  # on a CPU, where fewer rows measure the same
            rows, first = _fewer_rows(rows, run_s, settings), ()
            run_s = default.cold_run(subject.batch, rows)  # (one of its warm-up runs)
            projected = run_s * (WARM_RUNS + 1) * len(settings)
            if projected > TIME_LIMIT_S:  # even on fewer rows a run is long
                reason = _too_slow(rows, run_s, projected)
                return Tuning(DEFAULT, reason, (), time.perf_counter() - started)
        loaded, failed = [default], []
        for setting in settings[1:]:
            try:
                loaded.append(stack.enter_context(_loaded(subject, setting)))
            except BatchserveError as exc:  # e.g. a graph that cannot be captured
                failed.append(Trial(setting, (), exc.message))
        measured = _rounds(loaded, subject.batch, rows, started)
        measured[0] = (*first, *measured[0])
        trials = [Trial(c.setting, r) for c, r in zip(loaded, measured, strict=True)] + failed
        chosen, reason = decide(trials, prior(subject.device, cores))
        if subject.device.kind == "gpu" and places_auto(subject.config):
            cpu_instances, found = _cpu_beside(subject, default)
            chosen, reason = replace(chosen, cpu_instances=cpu_instances), f"{reason}; {found}"
    return Tuning(chosen, reason, tuple(trials), time.perf_counter() - started)


def _too_slow(rows: int, run_s: float, projected_s: float) -> str:
    """Why a model whose runs are long keeps the default: each candidate's warm-up runs
    and first round alone would take longer than a load may spend measuring (a model that
    took 4 s a run, whatever its rows, used to spend 35-41 s of its load measuring)."""
    return (
        f"one run of {rows} row(s) took {run_s:.1f} s: measuring would take about "
        f"{projected_s:.0f} s, past the {TIME_LIMIT_S:g} s a load may spend"
    )


def _light_tuning(samples_per_s: float, bar_ns: float, seconds: float) -> Tuning:
    reason = (
        f"a sample costs under {bar_ns / 1000:.0f} us ({LIGHT_LOOP_STEPS:,} steps of a "
        "Python loop on this host now): request handling dominates"
    )
    return Tuning(DEFAULT, reason, (Trial(DEFAULT, (samples_per_s,)),), seconds)


def _fewer_rows(rows: int, run_s: float, settings: Sequence[Setting]) -> int:
    """Rows whose run takes about ``RUN_S`` where ``rows`` took ``run_s``, and at least one
    for each instance of every setting."""
    most = max(setting.instances for setting in settings)
    return max(min(most, rows), int(rows * RUN_S / run_s))


def _cpu_beside(subject: Subject, gpu: _Candidate) -> tuple[int, str]:
    """Placement by measurement: one sample at a time, on the CPU and on the GPU (its
    transfers included); where the CPU is faster, a CPU instance beside the GPU ones takes
    the batches under the crossover, which the batcher learns from both (``routing.py``)."""
    with _loaded(replace(subject, device=CPU), DEFAULT) as cpu:
        on_cpu = cpu.run_round(subject.batch, ROUND_S, 1)
    on_gpu = gpu.run_round(subject.batch, ROUND_S, rows=1)
    figures = f"one sample at a time the CPU ran {on_cpu:.0f}/s, the GPU {on_gpu:.0f}/s"
    if on_cpu > on_gpu:
        return 1, f"{figures}: a CPU instance takes the batches under the crossover"
    return 0, f"{figures}: every batch runs on the GPU"


def light_sample_ns() -> float:
    """The cost under which a sample is light on this host now: ``LIGHT_LOOP_STEPS`` steps
    of a Python loop, at the fastest of ``FIRST_ROUNDS`` timings (a stall lengthens one)."""
    fastest = min(loop_seconds(TIMED_LOOP_STEPS) for _ in range(FIRST_ROUNDS))
    return fastest * 1e9 / TIMED_LOOP_STEPS * LIGHT_LOOP_STEPS


def _light(default: _Candidate, batch: Batch, rows: int, first: float, bar_ns: float) -> float:
    """The samples a second of the first of the default's short rounds that found a sample
    cheaper than ``bar_ns``, trying up to ``FIRST_ROUNDS`` unless the rounds so far all found
    it dearer than ``STALL_FACTOR`` times that; 0.0 when none found it cheaper."""
    fastest = first
    for _ in range(FIRST_ROUNDS - 1):
        if fastest * bar_ns > 1e9 or fastest * bar_ns * STALL_FACTOR < 1e9:
            break
        fastest = max(fastest, default.run_round(batch, FIRST_ROUND_S, rows))
    return fastest if fastest * bar_ns > 1e9 else 0.0


def _rows(config: ModelConfig, device: Device) -> int:
    """Rows each round runs at once: a batch that 16 clients make (more on a GPU, whose
    throughput comes from large batches), within the model's maximum."""
    if config.max_batch_size <= 0:
        return 1
    wanted = MEASURED_ROWS if device.kind == "cpu" else 4 * MEASURED_ROWS
    return min(config.max_batch_size, wanted)


@contextmanager
def _loaded(subject: Subject, setting: Setting) -> Iterator[_Candidate]:
    candidate = _Candidate(setting)
    try:
        candidate.load(subject.factory, subject.config, subject.model_file, subject.device)
        yield candidate
    finally:
        candidate.close()


def _rounds(
    loaded: Sequence[_Candidate], batch: Batch, rows: int, started: float
) -> list[tuple[float, ...]]:
    """Each candidate's samples per second on ``rows`` over up to ``ROUNDS`` interleaved
    rounds (every other round in reverse order, so that a drift in the machine's speed
    favours none)."""
    figures: list[list[float]] = [[] for _ in loaded]
    for number in range(ROUNDS):
        if number and time.perf_counter() - started > TIME_LIMIT_S:
            break
        order = list(enumerate(loaded))
        for index, candidate in order if number % 2 == 0 else reversed(order):
            figures[index].append(candidate.run_round(batch, ROUND_S, rows))
    return [tuple(f) for f in figures]


def log_tuning(model: str, tuning: Tuning) -> None:
    """One line saying what the load chose and every figure it chose from."""
    logger.info(
        "instances and threads chosen by measurement",
        extra={
            "model": model,
            "chosen": str(tuning.chosen),
            "reason": tuning.reason,
            "seconds": round(tuning.seconds, 2),
            "measured": {
                str(t.setting): round(t.samples_per_s, 1) if t.rounds else t.error
                for t in tuning.trials
            },
        },
    )
