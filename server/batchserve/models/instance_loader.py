"""Loading one model instance: its runtime, the memory it is measured to need, its
reservation in the device's budget, and its warm-up. Ready means all four.

A whole load (``registry``) and an instance change on a live model (``instance_change``)
load their instances here alike.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

from batchserve.backends.base import Arrays, Backend
from batchserve.core.device import Device
from batchserve.core.errors import BatchserveError, ModelConfigError
from batchserve.devices.placement import Placement
from batchserve.models.measuring_gate import MEASURING
from batchserve.models.memory_probe import declared_profile, probe_backend
from batchserve.models.model_directory import ModelVersion
from batchserve.models.model_table import InstanceMemory, LoadedInstance
from batchserve.models.warmup import synthetic_batch
from batchserve.models.warmup_samples import WarmupSample
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup
from batchserve.scheduler.batch_io import model_feed
from batchserve.scheduler.instances import Instance
from batchserve.scheduler.memory import (
    DeviceBudget,
    MemoryBudgets,
    MemoryProfile,
    ModelReservations,
    Reservation,
    probe_length,
)
from batchserve.scheduler.padding import row_positions
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.rate_limiter import instance_limits

logger = logging.getLogger(__name__)

BackendFactory = Callable[[ModelConfig, Path], Backend]

SLOW_PHASE_S = 1.0
"""A load phase (memory probe, warm-up) longer than this is logged at info level, so that a
person watching a slow load sees where its time goes; shorter ones at debug."""


def probe_row_positions(config: ModelConfig, free_dim: int, sample: Arrays | None) -> int:
    """The positions each row of the memory probe's batches held: ``free_dim`` on each free
    axis, or the positions of the warm-up sample the probe repeats; 0 for a model counted
    in rows."""
    axes = BatchPolicy.from_config(config, 1).position_inputs
    if not axes:
        return 0
    if sample is not None and (positions := row_positions(axes, sample)):
        return positions
    return int(free_dim ** max(len(free) for _, free in axes))


async def _run_sample(config: ModelConfig, instance: Instance, sample: WarmupSample) -> None:
    """Run one ``model_warmup`` sample ``count`` times, and log it; each run (at debug, as
    Triton's verbose log) and a failure name it, in Triton's words. A model with ragged
    batching takes the sample's rows as requests of one row each, as Triton's warm-up does."""
    started = time.perf_counter()
    fed = model_feed(config, sample.inputs)
    try:
        for iteration in range(1, sample.count + 1):
            logger.debug(
                "model '%s' instance %s is running warmup sample '%s' for iteration %d",
                config.name, instance.name, sample.name, iteration,
            )  # fmt: skip
            await instance.run(partial(instance.backend.infer, fed))
    except BatchserveError as exc:
        raise ModelConfigError(
            f"failed to run warmup sample '{sample.name}': {exc.message}"
        ) from exc
    logger.info(
        "warm-up sample run",
        extra={"instance": instance.name, "sample": sample.name, "count": sample.count,
               "ms": round((time.perf_counter() - started) * 1000, 1)},
    )  # fmt: skip


def load_twin(
    backend: Backend, model_file: Path, config: ModelConfig, device: Device, twin: Device,
    batch: Arrays,
) -> bool:  # fmt: skip
    """Load an instance whose memory a twin on device ``twin`` measured and run ``batch`` (at
    its cap) once, beside other twins but not beside a measurement; call it on the
    instance's own thread. False, and nothing run, where the runtime placed it elsewhere."""
    with MEASURING.loading():
        backend.load(model_file, config, device)
        if backend.device != twin:
            return False
        if declared_profile(backend) is None:
            backend.infer(batch)
    return True


def instance_ordinal(name: str) -> int:
    """An instance's place among its model's, from its name (``<model>-<version>-<n>``)."""
    tail = name.rpartition("-")[2]
    return int(tail) if tail.isdecimal() else 0


def instance_of(name: str, backend: Backend, placement: Placement) -> Instance:
    """An instance to be, with what its group's ``rate_limiter`` says it needs."""
    group = ModelInstanceGroup.FromString(placement.group)
    return Instance(name, backend, limits=instance_limits(group, placement.device))


def _log_loaded(
    config: ModelConfig, version: ModelVersion, name: str, memory: InstanceMemory, measured: bool
) -> None:
    logger.info(
        "instance loaded",
        extra={"model": config.name, "version": version.version, "instance": name,
               "device": str(memory.device), "batch_cap": memory.batch_cap,
               "batch_steps": memory.batch_steps, "fixed_bytes": memory.profile.fixed_bytes,
               "per_sample_bytes": memory.profile.per_sample_bytes,
               "reserved_bytes": memory.reserved_bytes, "measured": measured},
    )  # fmt: skip


def _log_phase(instance: str, phase: str, started: float) -> None:
    seconds = time.perf_counter() - started
    level = logging.INFO if seconds >= SLOW_PHASE_S else logging.DEBUG
    logger.log(
        level,
        "load phase done",
        extra={"instance": instance, "phase": phase, "seconds": round(seconds, 2)},
    )


class _Loading:
    """An instance being loaded: where its load fails, or gives up, its reservation is given
    back and it is closed, so that a failed load holds nothing."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self._reservations: ModelReservations | None = None
        self._reservation: Reservation | None = None

    def reserve(
        self,
        reservations: ModelReservations,
        budget: DeviceBudget,
        profile: MemoryProfile,
        sharing: int,
        row_positions: int,
    ) -> Reservation:
        """``reservations.reserve``, held by the instance (it may borrow beyond it) unless
        the model's own budget bounds it."""
        self._reservations = reservations
        self._reservation = reservations.reserve(budget, profile, sharing, row_positions)
        if reservations.limit_bytes is None:  # its own budget bounds it: no loans
            self.instance.reservation = self._reservation
        return self._reservation

    async def give_up(self) -> None:
        if self._reservations is not None and self._reservation is not None:
            self._reservations.release_one(self._reservation)
        await asyncio.to_thread(self.instance.close)

    async def __aenter__(self) -> _Loading:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:
            await self.give_up()


class InstanceLoader:
    """Loads instances into the devices' memory budgets with the server's runtimes."""

    def __init__(self, budgets: MemoryBudgets, backend_factory: BackendFactory) -> None:
        self.budgets = budgets
        self.backend_factory = backend_factory

    def _instance(
        self, name: str, config: ModelConfig, version: ModelVersion, placement: Placement
    ) -> Instance:
        backend = self.backend_factory(config, version.model_file)
        number = getattr(backend, "number_instance", None)
        if number is not None:  # Triton's identity backend delays its instances apart
            number(instance_ordinal(name))
        return instance_of(name, backend, placement)

    async def load(
        self,
        name: str,
        config: ModelConfig,
        version: ModelVersion,
        placement: Placement,
        reservations: ModelReservations,
        samples: tuple[WarmupSample, ...] = (),
        sharing: int = 1,
        twin: InstanceMemory | None = None,
    ) -> LoadedInstance:
        """Load, measure, reserve, then warm up (the config's ``model_warmup`` samples, as
        Triton runs them, then a batch at the derived cap where the probe ran no batch of
        that size: its largest it ran twice). A failure leaves nothing held.
        ``sharing``: this instance and those still to load after it, which share evenly
        what the model's own budget has left. ``twin``: what an instance of the same
        placement was measured to need; given, this one reserves that before it loads, is
        not measured, and loads beside other such instances (``load_twin``)."""
        if twin is not None:
            loaded = await self._load_twin(
                name, config, version, placement, reservations, samples, sharing, twin
            )
            if loaded is not None:
                return loaded
        loading = _Loading(self._instance(name, config, version, placement))
        backend = loading.instance.backend
        free_dim = probe_length(config)
        first = samples[0].inputs if samples else None
        async with loading:
            allowance = reservations.allowance(self.budgets.for_device(placement.device), sharing)
            started = time.perf_counter()
            profile = await loading.instance.run(
                partial(probe_backend, backend, version.model_file, config, placement.device,
                        limit_bytes=allowance, free_dim=free_dim, sample=first)
            )  # fmt: skip
            _log_phase(name, "load and memory probe", started)
            budget = self.budgets.for_device(backend.device)
            row_positions = probe_row_positions(config, free_dim, first)
            reservation = loading.reserve(reservations, budget, profile, sharing, row_positions)
            cap = reservation.batch_cap if config.max_batch_size > 0 else 1
            started = time.perf_counter()
            for sample in samples:
                await _run_sample(config, loading.instance, sample)
            declared = declared_profile(backend) is not None  # not run at load
            if not declared and cap not in {measured.batch_size for measured in profile.samples}:
                batch = synthetic_batch(config, cap, free_dim, first)
                await loading.instance.run(partial(backend.infer, batch))
            _log_phase(name, "warm-up", started)
        memory = InstanceMemory(
            backend.device, profile, reservation.nbytes, cap, reservation.batch_steps,
            probe_row_positions=row_positions,
        )  # fmt: skip
        _log_loaded(config, version, name, memory, measured=True)
        return LoadedInstance(loading.instance, placement, memory, reservation)

    async def _load_twin(
        self,
        name: str,
        config: ModelConfig,
        version: ModelVersion,
        placement: Placement,
        reservations: ModelReservations,
        samples: tuple[WarmupSample, ...],
        sharing: int,
        twin: InstanceMemory,
    ) -> LoadedInstance | None:
        """An instance loaded on its twin's profile: reserved first, then loaded and run at
        its cap once, beside other twins. None where its runtime placed it elsewhere than
        its twin's (a fallback to the CPU one of them took): that one is measured."""
        loading = _Loading(self._instance(name, config, version, placement))
        budget = self.budgets.for_device(twin.device)
        async with loading:
            reservation = loading.reserve(
                reservations, budget, twin.profile, sharing, twin.probe_row_positions
            )
            cap = reservation.batch_cap if config.max_batch_size > 0 else 1
            first = samples[0].inputs if samples else None
            batch = synthetic_batch(config, cap, probe_length(config), first)
            started = time.perf_counter()
            if not await loading.instance.run(
                partial(load_twin, loading.instance.backend, version.model_file, config,
                        placement.device, twin.device, batch)
            ):  # fmt: skip
                await loading.give_up()
                return None
            for sample in samples:
                await _run_sample(config, loading.instance, sample)
            _log_phase(name, "load and warm-up", started)
        memory = replace(
            twin, reserved_bytes=reservation.nbytes, batch_cap=cap,
            batch_steps=reservation.batch_steps,
        )  # fmt: skip
        _log_loaded(config, version, name, memory, measured=False)
        return LoadedInstance(loading.instance, placement, memory, reservation)

    def check_room(
        self,
        measured: Sequence[LoadedInstance],
        rest: Sequence[Placement],
        reservations: ModelReservations,
    ) -> None:
        """Once two instances on a device are measured, refuse a load whose instances still
        to come there cannot fit (``ModelReservations.check_room``): the first instance a
        process loads pays its runtime's one-time costs, the smaller of two does not."""
        for device in {placement.device for placement in rest}:
            memories = [one.memory for one in measured if one.placement.device == device]
            if len(memories) < 2:
                continue
            smallest = min((memory.profile for memory in memories), key=lambda p: p.predict(1))
            remaining = sum(placement.device == device for placement in rest)
            budget = self.budgets.for_device(memories[-1].device)
            reservations.check_room(budget, smallest, remaining)

    async def close(self, loaded: LoadedInstance, reservations: ModelReservations) -> None:
        """Unload an instance no batch runs on any more, and give its memory back."""
        await asyncio.to_thread(loaded.instance.close)
        reservations.release_one(loaded.reservation)


def active_instances(loaded: Sequence[LoadedInstance]) -> list[LoadedInstance]:
    """The instances requests go to: all but the passive ones (Triton's ``passive: true``),
    which are loaded, warmed up and counted against memory, and run nothing."""
    return [one for one in loaded if not one.placement.passive]
