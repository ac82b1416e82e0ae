"""Per-device memory budgets: how many samples a model instance may batch, and whether it loads.

At load the server measures an instance at a few batch sizes (``memory_probe``), fits
``fixed + per_sample * batch``, and reserves the prediction at the largest batch that fits
what remains of the device's budget. The budget is shared by every instance on the device;
a load that does not fit even at batch 1 is refused with the numbers. All of this is
thread-safe: loads run in worker threads, unloads on the event loop.

A sequence model's memory grows with its rows times their padded length, not its rows
alone: char_lstm held 245 MiB more after 8 rows of 10,000 tokens, 48 times what 8 rows of
the probe's 128 were measured to need. So its batches are counted in steps (``StepBudget``):
the reservation covers a number of steps, and batches are formed, and requests admitted,
within it. So are the pixels of a model with free height and width where its memory
amplifies its requests: one 2048 x 2048 image took a small CNN's instance from 1.4 to
3.0 GiB. A request alone past its instance's reservation runs on memory the budget lends
for its run (``Reservation.borrow``), out of what no instance has reserved.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from batchserve.core.budgets import DEFAULT_BUDGET, BudgetSpec, format_bytes
from batchserve.core.datatypes import BY_CONFIG
from batchserve.core.device import Device, DeviceKind
from batchserve.core.errors import ModelConfigError, OutOfMemory, Unavailable
from batchserve.proto.model_config_pb2 import ModelConfig


@dataclass(frozen=True, slots=True)
class MemorySample:
    """Memory an instance held after running batches of up to ``batch_size`` samples, and
    how long the batch of ``batch_size`` took (0: not timed); the batcher's batch-time model
    starts from these."""

    batch_size: int
    nbytes: int
    run_ns: int = 0


@dataclass(frozen=True, slots=True)
class MemoryProfile:
    """``fixed + per_sample * batch``, fitted so it never predicts less than was measured.

    Args:
        fixed_bytes: weights, session and arena overhead: held at any batch size.
        per_sample_bytes: activations and buffers that grow with the batch (never negative).
        samples: the measurements the line was fitted to.
    """

    fixed_bytes: int
    per_sample_bytes: int
    samples: tuple[MemorySample, ...] = ()

    def predict(self, batch_size: int) -> int:
        return self.fixed_bytes + self.per_sample_bytes * batch_size

    def per_step(self, steps_per_sample: int) -> MemoryProfile:
        """The profile of one step, for samples measured ``steps_per_sample`` steps long
        (rounded up: the whole per-sample cost is charged to the steps)."""
        per_step = -(-self.per_sample_bytes // max(1, steps_per_sample))
        return MemoryProfile(self.fixed_bytes, per_step, self.samples)

    @classmethod
    def fit(cls, samples: Sequence[MemorySample]) -> MemoryProfile:
        """Least squares with both terms clamped at 0, then raised to cover every sample.

        The raise matters: a budget that reserves less than the instance was seen to hold
        would let the device run out. A single batch size gives a flat profile.
        """
        if not samples:
            raise ValueError("a memory profile needs at least one measurement")
        slope, intercept = _least_squares(samples)
        shortfall = max(s.nbytes - (intercept + slope * s.batch_size) for s in samples)
        fixed = math.ceil(intercept + max(0.0, shortfall))
        return cls(fixed, math.ceil(slope), tuple(samples))


def _least_squares(samples: Sequence[MemorySample]) -> tuple[float, float]:
    """(slope, intercept) minimising squared error with slope >= 0 and intercept >= 0."""
    n = len(samples)
    xs = [float(s.batch_size) for s in samples]
    ys = [float(max(0, s.nbytes)) for s in samples]
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return 0.0, max(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    if slope <= 0:
        return 0.0, mean_y
    intercept = mean_y - slope * mean_x
    if intercept < 0:
        return sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs), 0.0
    return slope, intercept


LOAN_WAIT_S = 0.25
"""How often a batch waiting for a loan looks again whether it can still be lent at all."""

PROBE_SEQUENCE_LENGTH = 128
"""The size free (-1) axes are measured and warmed up at (``memory_probe``): the steps a row
of a sequence model's probe batch holds, an image's height and width."""
PROBE_ROW_POSITIONS = PROBE_SEQUENCE_LENGTH**2
"""Most positions (the product of its free axes' sizes) an input's probe row holds: an input
with three or more free axes is probed smaller on each."""


AMPLIFICATION_COUNTED = 8
"""A model with free non-batch axes and no sequence-length input is counted in positions
when a position costs it more than this many times the bytes it carries in a request: at
or below it, the request body limit (64 MiB) already bounds what one request may take
(512 MiB). Measured by the memory probe: an identity model over a free INT32 axis costs
3.6 times a position's 4 bytes (its output, a copy of its input, the runtime's rounding);
a CNN with free height and width and two 32-channel convolutions 27.7 times a FP32
pixel's 12 bytes, and one 2048 x 2048 image took its process from 1.4 to 3.0 GiB."""


@dataclass(frozen=True, slots=True)
class StepBudget:
    """A batch counted in positions: rows times a row's positions, padded. A sequence
    model's positions are the steps of its padded length; an image model's, the pixels of
    its free height and width (the product of an input's free axes).

    Args:
        per_row: positions in each row of the probe's batches (``probe_length`` on each
            free axis).
        most: the positions a batch may hold at most: ``batchserve.max_batch_steps``, or
            ``max_batch_size`` rows of ``per_row``.
        request_bytes: for a model counted only where its memory amplifies its requests
            (free axes, no sequence-length input, no ``max_batch_steps``), the bytes a
            position carries in a request; 0: always counted.
    """

    per_row: int
    most: int
    request_bytes: int = 0

    @classmethod
    def from_config(cls, config: ModelConfig) -> StepBudget | None:
        """None for a model whose batches are counted in rows (no batch axis, no free
        non-batch axis, or a BYTES input with one: its bytes per position are unknown)."""
        if config.max_batch_size <= 0:
            return None
        configured = config.batchserve.max_batch_steps
        if config.batchserve.sequence_length_input:
            most = configured or config.max_batch_size * PROBE_SEQUENCE_LENGTH
            return cls(PROBE_SEQUENCE_LENGTH, most)
        free = [tensor for tensor in config.input if any(dim < 0 for dim in tensor.dims)]
        if not free:
            return None
        per_row = probe_length(config) ** max(sum(d < 0 for d in t.dims) for t in free)
        if configured:
            return cls(per_row, configured)
        request_bytes = 0
        for tensor in free:
            datatype = BY_CONFIG.get(tensor.data_type)
            if datatype is None or not datatype.itemsize:
                return None
            request_bytes += datatype.itemsize * math.prod(d for d in tensor.dims if d > 0)
        return cls(per_row, config.max_batch_size * per_row, request_bytes)

    @property
    def least(self) -> int:
        """Positions an instance must hold to load: one probe row, or all it may ever take."""
        return min(self.most, self.per_row)

    def counts(self, profile: MemoryProfile) -> bool:
        """Whether batches are counted in positions, given what a probe row was measured to
        cost: always, but for a model counted only where its memory amplifies its requests
        (``AMPLIFICATION_COUNTED``)."""
        if not self.request_bytes:
            return True
        return profile.per_sample_bytes > AMPLIFICATION_COUNTED * self.request_bytes * self.per_row

    def rows(self, steps: int, max_batch_size: int) -> int:
        """Rows a batch may hold with ``steps`` reserved: all of ``max_batch_size`` when
        every position wanted fits, else as many probe-sized rows as the positions hold."""
        if steps >= self.most:
            return max_batch_size
        return min(max_batch_size, max(1, steps // self.per_row))


def fewest_positions(instances_positions: Iterable[int]) -> int:
    """The positions a batch may hold on any of a model's instances: the fewest among those
    counted in positions (an instance measured below ``AMPLIFICATION_COUNTED`` counts rows
    and holds 0); 0 when none is."""
    return min((positions for positions in instances_positions if positions), default=0)


def probe_length(config: ModelConfig) -> int:
    """The size every free non-batch axis is probed and warmed up at: ``PROBE_SEQUENCE_LENGTH``,
    or less where an input has three free axes or more (at most ``PROBE_ROW_POSITIONS`` a
    row). Not 1: a CNN exported with free height and width whose first convolution is
    unpadded cannot run a 1x1 image, and failed to load; nor did a 1x1 image measure what
    an image costs."""
    free = max((sum(dim < 0 for dim in tensor.dims) for tensor in config.input), default=0)
    if free <= 2:
        return PROBE_SEQUENCE_LENGTH
    return max(1, int(round(PROBE_ROW_POSITIONS ** (1 / free), 9)))


def derive_cap(
    profile: MemoryProfile, available_bytes: int, max_batch_size: int, least: int = 1
) -> int:
    """Largest batch (at most ``max_batch_size``) whose predicted memory fits; 0 if even
    ``least`` does not."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size {max_batch_size} < 1 (a model without batching is 1)")
    if profile.predict(least) > available_bytes:
        return 0
    if profile.per_sample_bytes == 0:
        return max_batch_size
    return min(max_batch_size, (available_bytes - profile.fixed_bytes) // profile.per_sample_bytes)


def arena_limit_bytes(profile: MemoryProfile, batch_cap: int, margin: float = 0.25) -> int:
    """A runtime arena cap (``OnnxBackend(memory_limit_bytes=...)``) for an instance capped at
    ``batch_cap``: a batch well above the cap then fails in the runtime instead of eating the
    device. The margin absorbs measurement noise at the cap itself."""
    return math.ceil(profile.predict(batch_cap) * (1 + margin))


class Reservation:
    """Memory one instance holds in a device budget until ``release`` (idempotent)."""

    __slots__ = ("_budget", "batch_cap", "batch_steps", "nbytes", "owner", "position_bytes")

    def __init__(
        self,
        budget: DeviceBudget,
        owner: str,
        nbytes: int,
        batch_cap: int,
        batch_steps: int = 0,
        position_bytes: int = 0,
    ) -> None:
        self._budget = budget
        self.owner = owner
        self.nbytes = nbytes
        self.batch_cap = batch_cap
        self.batch_steps = batch_steps
        """Positions a batch may hold (``StepBudget``: steps, pixels); 0: counted in rows."""
        self.position_bytes = position_bytes
        """What a position was measured to cost, where counted in positions."""

    @property
    def device(self) -> Device:
        return self._budget.device

    def extra_bytes(self, positions: int) -> int:
        """What a batch of ``positions`` needs beyond the reservation (0 within it)."""
        if not self.batch_steps or positions <= self.batch_steps:
            return 0
        return (positions - self.batch_steps) * self.position_bytes

    def unreserved_bytes(self) -> int:
        """What no instance has reserved on its device: what loans may take in turn."""
        return self._budget.unreserved()

    def could_lend(self, positions: int) -> bool:
        """Whether the device budget could lend what ``positions`` need beyond the
        reservation: within what no instance has reserved (loans come back)."""
        return self.extra_bytes(positions) <= self._budget.unreserved()

    def borrow(self, positions: int) -> Loan | None:
        """Borrow what a batch of ``positions`` needs beyond the reservation for its run,
        waiting while other loans hold it (``DeviceBudget.lend``); None within it."""
        extra = self.extra_bytes(positions)
        return self._budget.lend(self.owner, extra) if extra else None

    def release(self) -> None:
        self._budget.release(self)

    def __repr__(self) -> str:
        return (
            f"Reservation({self.owner!r}, {self.device}, {format_bytes(self.nbytes)}, "
            f"batch_cap={self.batch_cap}, batch_steps={self.batch_steps})"
        )


class Loan:
    """Memory lent by a device budget to one batch for its run; ``close`` returns it."""

    __slots__ = ("_budget", "nbytes")

    def __init__(self, budget: DeviceBudget, nbytes: int) -> None:
        self._budget = budget
        self.nbytes = nbytes

    def close(self) -> None:
        nbytes, self.nbytes = self.nbytes, 0
        if nbytes:
            self._budget.repay(nbytes)


class DeviceBudget:
    """The memory every instance on one device shares; thread-safe.

    Reservations are handles rather than names, so a model being reloaded can hold its old
    and new instances' memory at once, under the same owner name.
    """

    def __init__(self, device: Device, total_bytes: int) -> None:
        if total_bytes < 0:
            raise ValueError(f"{device} budget of {total_bytes} bytes is negative")
        self.device = device
        self.total_bytes = total_bytes
        self._lock = threading.Lock()
        self._repaid = threading.Condition(self._lock)
        self._held: list[Reservation] = []
        self._lent = 0

    def available(self) -> int:
        """What is neither reserved nor lent now: what a load may reserve."""
        with self._lock:
            return self._free()

    def unreserved(self) -> int:
        """What no instance has reserved: what loans may take, one after another."""
        with self._lock:
            return self.total_bytes - sum(r.nbytes for r in self._held)

    @property
    def lent_bytes(self) -> int:
        """Lent to batches running now."""
        return self._lent

    def lend(self, owner: str, nbytes: int) -> Loan:
        """Lend ``nbytes`` to one batch of ``owner`` beyond its instance's reservation,
        waiting while other loans hold what it needs (they end with their batches' runs).

        Raises Unavailable when what no instance has reserved cannot hold it (a load took
        the memory after the request was admitted).
        """
        with self._repaid:
            while nbytes > self._free():
                unreserved = self.total_bytes - sum(r.nbytes for r in self._held)
                if nbytes > unreserved:
                    raise Unavailable(
                        f"model '{owner}' needs {format_bytes(nbytes)} beyond its reservation "
                        f"for this request, and only {format_bytes(unreserved)} of the "
                        f"{self.device} budget is unreserved now; retry later"
                    )
                self._repaid.wait(LOAN_WAIT_S)
            self._lent += nbytes
        return Loan(self, nbytes)

    def repay(self, nbytes: int) -> None:
        """A loan's memory comes back (``Loan.close``)."""
        with self._repaid:
            self._lent -= nbytes
            self._repaid.notify_all()

    def holdings(self) -> dict[str, int]:
        """Bytes held per owner (several reservations of one owner are summed)."""
        with self._lock:
            return dict(self._holdings_unlocked())

    def reserve(
        self,
        owner: str,
        profile: MemoryProfile,
        max_batch_size: int,
        limit_bytes: int | None = None,
        steps: StepBudget | None = None,
    ) -> Reservation:
        """Reserve ``profile`` at the largest batch that fits (and fits ``limit_bytes``): in
        rows, or with ``steps``, in positions (a sequence model's steps, an image's pixels).

        Raises ModelConfigError when the model can never fit (its own limit or the whole
        budget is too small), OutOfMemory when it does not fit beside what others hold.
        """
        with self._lock:
            free = self._free()
            allowed = free if limit_bytes is None else min(free, limit_bytes)
            if steps is None:
                cap = derive_cap(profile, allowed, max_batch_size)
                nbytes, rows, batch_steps, step_bytes = profile.predict(cap), cap, 0, 0
            else:
                step = profile.per_step(steps.per_row)
                cap = derive_cap(step, allowed, steps.most, steps.least)
                nbytes, rows, batch_steps = step.predict(cap), steps.rows(cap, max_batch_size), cap
                step_bytes = step.per_sample_bytes
            if cap == 0:
                raise self._refusal(owner, profile, free, limit_bytes)
            reservation = Reservation(self, owner, nbytes, rows, batch_steps, step_bytes)
            self._held.append(reservation)
            return reservation

    def release(self, reservation: Reservation) -> None:
        """Give the reservation's memory back; releasing twice is harmless."""
        with self._repaid:
            if reservation in self._held:
                self._held.remove(reservation)
                self._repaid.notify_all()

    def _refusal(
        self, owner: str, profile: MemoryProfile, free: int, limit_bytes: int | None
    ) -> ModelConfigError | OutOfMemory:
        need = (
            f"model '{owner}' needs {format_bytes(profile.predict(1))} at batch 1 (fixed "
            f"{format_bytes(profile.fixed_bytes)} + {format_bytes(profile.per_sample_bytes)} "
            "per sample)"
        )
        if limit_bytes is not None and profile.predict(1) > limit_bytes:
            limit = format_bytes(limit_bytes)
            return ModelConfigError(
                f"{need} but its batchserve.memory_budget_bytes leaves {limit} for this instance"
            )
        if profile.predict(1) > self.total_bytes:
            return ModelConfigError(
                f"{need} but the whole {self.device} budget is {format_bytes(self.total_bytes)}; "
                "raise --memory-budget or place the model on a larger device"
            )
        held = ", ".join(f"{name} {format_bytes(n)}" for name, n in self._holdings_unlocked())
        return OutOfMemory(
            f"{need} but only {format_bytes(free)} of the {self.device} budget of "
            f"{format_bytes(self.total_bytes)} is free (held: {held})"
        )

    def _free(self) -> int:
        return self.total_bytes - sum(r.nbytes for r in self._held) - self._lent

    def _holdings_unlocked(self) -> list[tuple[str, int]]:
        held: dict[str, int] = {}
        for reservation in self._held:
            held[reservation.owner] = held.get(reservation.owner, 0) + reservation.nbytes
        return sorted(held.items())


class ModelReservations:
    """The reservations of one loaded model version, all under its ``memory_budget_bytes``.

    The config's budget covers the version's instances together, on whatever devices; a
    version being replaced keeps its own until it is closed, so a reload is not refused for
    memory the outgoing version still holds.
    """

    def __init__(
        self,
        model: str,
        max_batch_size: int,
        limit_bytes: int | None = None,
        steps: StepBudget | None = None,
    ) -> None:
        self.model = model
        self.max_batch_size = max(1, max_batch_size)
        self.limit_bytes = limit_bytes
        self.steps = steps
        self._lock = threading.Lock()
        self._held: list[Reservation] = []

    @classmethod
    def from_config(cls, config: ModelConfig) -> ModelReservations:
        """A model without a batch axis (max_batch_size 0) runs one sample at a time."""
        limit = config.batchserve.memory_budget_bytes or None
        return cls(config.name, config.max_batch_size, limit, StepBudget.from_config(config))

    @property
    def reservations(self) -> tuple[Reservation, ...]:
        with self._lock:
            return tuple(self._held)

    def allowance(self, budget: DeviceBudget, sharing: int = 1) -> int:
        """What the next instance may use on ``budget`` now (a probe's ``limit_bytes``), when
        it and ``sharing - 1`` instances after it share what the model has left."""
        with self._lock:
            share = self._share(sharing)
        return budget.available() if share is None else min(share, budget.available())

    def reserve(
        self,
        budget: DeviceBudget,
        profile: MemoryProfile,
        sharing: int = 1,
        steps_per_row: int = 0,
    ) -> Reservation:
        """Reserve one instance's memory on ``budget`` within its even share of what the model
        has left: the model batches at its smallest instance's cap, so an instance that took
        all of it would leave the next ones smaller caps, or none. A share smaller than one
        sample still takes one where what is left holds it: instances' needs differ (the
        first a process loads pays its runtime's one-time costs). ``steps_per_row``: the
        positions the probe's rows had (a warm-up sample's, where it has one; 0: the
        probe's own size)."""
        steps = self.steps
        if steps is not None:
            steps = replace(steps, per_row=max(1, steps_per_row or steps.per_row))
            if not steps.counts(profile):
                steps = None
        with self._lock:
            limit = self._share(sharing, at_least=profile.predict(1))
            reservation = budget.reserve(self.model, profile, self.max_batch_size, limit, steps)
            self._held.append(reservation)
            return reservation

    def check_room(self, budget: DeviceBudget, smallest: MemoryProfile, instances: int) -> None:
        """Refuse at once a load whose ``instances`` still to come cannot all fit on
        ``budget``, even at one sample each of the ``smallest`` measured so far, instead of
        probing them one by one until it runs out: ``count: 100000`` loaded instances for
        minutes before failing, and left thousands to unload at shutdown. One instance still
        to come is left to its own reservation, whose refusal says more."""
        if instances < 2:
            return
        per_instance = smallest.predict(1)
        need = instances * per_instance
        with self._lock:
            left = self._left()
        free = budget.available()
        room = free if left is None else min(left, free)
        if need <= room:
            return
        own = self.limit_bytes is not None and self.limit_bytes < budget.total_bytes
        whole = self.limit_bytes if own and self.limit_bytes is not None else budget.total_bytes
        what = (
            f"model '{self.model}': {instances} more instance(s) on {budget.device} need at "
            f"least {format_bytes(need)} ({format_bytes(per_instance)} each at batch 1, the "
            f"smallest measured so far)"
        )
        if need > whole:
            where = "its memory_budget_bytes" if own else "the budget"
            raise ModelConfigError(
                f"{what}, more than {where} of {format_bytes(whole)}; lower the "
                "instance_group count or raise the budget"
            )
        raise OutOfMemory(f"{what}, but {format_bytes(room)} is free")

    def reserve_rows(self, budget: DeviceBudget, row_bytes: int, most: int) -> Reservation:
        """Reserve ``row_bytes`` for each of as many rows as fit, at most ``most`` (its
        ``batch_cap`` says how many): what a model keeps per row beyond its instances, such
        as the state of each live sequence."""
        profile = MemoryProfile(0, max(1, row_bytes))
        with self._lock:
            reservation = budget.reserve(self.model, profile, most, self._left())
            self._held.append(reservation)
            return reservation

    def _left(self) -> int | None:
        if self.limit_bytes is None:
            return None
        return self.limit_bytes - sum(r.nbytes for r in self._held)

    def _share(self, sharing: int, at_least: int = 0) -> int | None:
        """An even share of what the model has left among ``sharing`` instances, raised to
        ``at_least`` where what is left holds that."""
        left = self._left()
        return None if left is None else min(left, max(left // max(1, sharing), at_least))

    def release_one(self, reservation: Reservation) -> None:
        """Give back one instance's memory (an instance removed from a live model)."""
        with self._lock:
            if reservation in self._held:
                self._held.remove(reservation)
        reservation.release()

    def release(self) -> None:
        """Give back every instance's memory (at unload, or when the load failed)."""
        with self._lock:
            held, self._held = self._held, []
        for reservation in held:
            reservation.release()


class MemoryBudgets:
    """Every device's budget, created on first use from the device's total memory.

    Args:
        specs: budget per device kind (``parse_budgets`` of the ``--memory-budget`` flag).
        device_total: total memory of a device (``memory_probe.device_total_bytes``).
    """

    def __init__(
        self, specs: Mapping[DeviceKind, BudgetSpec], device_total: Callable[[Device], int]
    ) -> None:
        self._specs = dict(specs)
        self._device_total = device_total
        self._lock = threading.Lock()
        self._budgets: dict[Device, DeviceBudget] = {}

    def for_device(self, device: Device) -> DeviceBudget:
        with self._lock:
            budget = self._budgets.get(device)
            if budget is None:
                spec = self._specs.get(device.kind, DEFAULT_BUDGET)
                budget = DeviceBudget(device, spec.of(self._device_total(device)))
                self._budgets[device] = budget
            return budget

    def budgets(self) -> list[DeviceBudget]:
        """The budgets of devices used so far (for metrics), CPU first then GPUs by index."""
        with self._lock:
            return sorted(self._budgets.values(), key=lambda b: (b.device.kind, b.device.index))
