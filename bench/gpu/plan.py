"""What the check measures and how long it may take: the grid, its cost, and what to drop.

Every served case has a priority. The judged one comes first on every runtime (the
ResNet-50-like model in FP16 with dynamic batching on and CUDA graphs off, over both
protocols at every concurrency), then the rest in the order below, which compare with it
over gRPC alone. When the estimate of the whole run exceeds the budget (``GPU_BUDGET_S``),
a priority level that no longer fits is dropped on every runtime alike, and the cheaper
levels after it are still tried; the judged level is never dropped. The estimates are
rough: the run also stops starting cases (but the judged ones) once the time left is less
than a case is planned to take.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.gpu.records import DIGITS, MODELS, RESNET, Key, Variant
from bench.gpu.runtimes import PRECISIONS
from bench.gpu.variants import batch_sizes

JUDGED = Variant(batching=True, graphs=False)
PROTOCOLS = ("http", "grpc")
GPU_BUDGET_S = 480.0
"""A whole GPU run: 8 minutes, so that ``make gpu-check`` with its environment's set-up
fits one 10-minute command on a machine lent for a short while, and a second try fits
beside it. ``--budget-s`` gives a longer run the time."""


@dataclass(frozen=True)
class Grid:
    """The shape of a run.

    Args:
        cpu: the dry run on the CPU runtimes.
        max_batch: every model's ``max_batch_size`` (and the largest in-process batch).
        image_size: the ResNet-like model's input height and width.
        concurrency: the served concurrencies of the judged case.
        window_s: the measurement window of one served point.
        ceiling_s: the in-process time spent on each batch size.
        budget_s: the whole run's time limit.
    """

    cpu: bool
    max_batch: int
    image_size: int
    concurrency: tuple[int, ...]
    window_s: float
    ceiling_s: float
    budget_s: float

    @classmethod
    def for_mode(cls, cpu: bool) -> Grid:
        if cpu:
            return cls(True, 8, 64, (1, 4), 2.0, 0.3, 600.0)
        return cls(False, 64, 224, (1, 4, 16, 64, 256), 2.0, 0.3, GPU_BUDGET_S)

    @property
    def batches(self) -> tuple[int, ...]:
        return batch_sizes(self.max_batch)

    def subset(self, wanted: Sequence[int]) -> tuple[int, ...]:
        """The concurrencies of ``wanted`` this grid has (its smallest and largest if none)."""
        found = tuple(c for c in self.concurrency if c in wanted)
        return found or (self.concurrency[0], self.concurrency[-1])


@dataclass(frozen=True)
class Case:
    """One served configuration: a server started once, then every point on it."""

    key: Key
    variant: Variant
    concurrency: tuple[int, ...]
    priority: int
    protocols: tuple[str, ...] = PROTOCOLS

    @property
    def points(self) -> int:
        return len(self.protocols) * len(self.concurrency)

    @property
    def label(self) -> str:
        return f"{self.key.label}, {self.variant.label}"


GRPC = ("grpc",)
GRAPHS = Variant(batching=True, graphs=True)
UNBATCHED = Variant(batching=False, graphs=False)
# (model, precision, variant, concurrencies (None: all), protocols) in priority order.
_CASES = (
    (RESNET, "fp16", JUDGED, None, PROTOCOLS),
    (RESNET, "fp16", UNBATCHED, (1, 16, 64), GRPC),
    (RESNET, "fp16", GRAPHS, (1, 16, 64), GRPC),
    (DIGITS, "fp16", JUDGED, (1, 16, 256), PROTOCOLS),
    (RESNET, "fp32", JUDGED, (1, 64), GRPC),
    (DIGITS, "fp32", JUDGED, (1, 64), GRPC),
    (DIGITS, "fp16", GRAPHS, (1, 16), GRPC),
)
_CPU_CASES = (  # the dry run: every kind of case once, on few points
    (RESNET, "fp16", JUDGED, None, PROTOCOLS),
    (RESNET, "fp16", UNBATCHED, (4,), GRPC),
    (RESNET, "fp16", GRAPHS, (4,), GRPC),
    (DIGITS, "fp16", JUDGED, (1,), PROTOCOLS),
    (RESNET, "fp32", JUDGED, (1,), GRPC),
    (DIGITS, "fp32", JUDGED, (4,), GRPC),
)


def cases(runtimes: Sequence[str], grid: Grid) -> list[Case]:
    """Every candidate case, highest priority first, each priority over every runtime."""
    found = []
    table = _CPU_CASES if grid.cpu else _CASES
    for priority, (model, precision, variant, wanted, protocols) in enumerate(table):
        concurrency = grid.concurrency if wanted is None else grid.subset(wanted)
        for runtime in runtimes:
            key = Key(model, runtime, precision)
            found.append(Case(key, variant, concurrency, priority, protocols))
    return found


def keys(runtimes: Sequence[str]) -> list[Key]:
    """Every export: each network on each runtime at each precision."""
    return [Key(m, r, p) for r in runtimes for m in MODELS for p in PRECISIONS]


# Rough seconds per step, from the model's size; a GPU machine and the 2-core dry run.
_START_S = {(RESNET, False): 25.0, (DIGITS, False): 8.0, (RESNET, True): 20.0, (DIGITS, True): 6.0}
_EXPORT_S = {"onnx": {RESNET: 40.0, DIGITS: 10.0}, "plan": {RESNET: 180.0, DIGITS: 40.0},
             "pt2": {RESNET: 60.0, DIGITS: 15.0}}  # fmt: skip
TESTS_S = {False: 120.0, True: 90.0}
TESTS_LIMIT = 1.5
"""The GPU tests may run this many times their planned seconds; a test directory still
running then is stopped and reported as over its time, so that the benchmark still runs."""


def case_s(case: Case, grid: Grid, point_s: float) -> float:
    return _START_S[(case.key.model, grid.cpu)] + case.points * point_s


def export_s(key: Key, kind: str, grid: Grid) -> float:
    """``kind``: "onnx", "plan" or "pt2"; the dry run's smaller images export faster."""
    seconds = _EXPORT_S[kind][key.model]
    return seconds / 2 if grid.cpu else seconds


def engine_s(grid: Grid) -> float:
    """One model in-process: load, accuracy batch, every batch size."""
    return 10.0 + len(grid.batches) * (grid.ceiling_s + 0.3)


@dataclass(frozen=True)
class Budget:
    """The phases' planned seconds, the cases kept and those dropped to fit the limit."""

    phases: tuple[tuple[str, float], ...]
    kept: tuple[Case, ...]
    dropped: tuple[Case, ...]

    @property
    def total_s(self) -> float:
        return sum(seconds for _, seconds in self.phases)


def judged_s(candidates: Sequence[Case], grid: Grid, point_s: float) -> float:
    """The judged level's planned seconds: the judged case on every runtime."""
    return sum(case_s(c, grid, point_s) for c in candidates if c.priority == 0)


def fit(
    fixed: Sequence[tuple[str, float]], candidates: Sequence[Case], grid: Grid, point_s: float
) -> Budget:
    """Keep whole priority levels (a level: one case on every runtime), in order: the judged
    level always (the check is for it, so a run with many runtimes goes past its budget
    rather than without it), then each one that still fits after the fixed phases and the
    levels kept before it."""
    left = grid.budget_s - sum(seconds for _, seconds in fixed)
    kept: list[Case] = []
    dropped: list[Case] = []
    for priority in sorted({c.priority for c in candidates}):
        level = [c for c in candidates if c.priority == priority]
        cost = sum(case_s(c, grid, point_s) for c in level)
        if cost <= left or priority == 0:
            kept += level
            left -= cost
        else:
            dropped += level
    served = sum(case_s(c, grid, point_s) for c in kept)
    phases = (*fixed, (f"served: {len(kept)} cases, {sum(c.points for c in kept)} points", served))
    return Budget(phases, tuple(kept), tuple(dropped))


def budget_lines(budget: Budget, grid: Grid) -> list[str]:
    """The plan as printed at the start."""
    lines = [f"  {name:<48} {seconds:6.0f} s" for name, seconds in budget.phases]
    lines.append(f"  {'total (limit ' + f'{grid.budget_s:.0f} s)':<48} {budget.total_s:6.0f} s")
    lines += [f"  dropped to fit: {case.label}" for case in budget.dropped]
    return lines
