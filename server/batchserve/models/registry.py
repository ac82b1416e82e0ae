"""The models this server holds: loading, readiness and unloading (lookup: ``model_table``).

Loading happens off the event loop; a model is READY only once every instance is loaded
and has run a warm-up batch. Reloading builds the new versions first and swaps them in,
so requests in flight on the old ones finish and none are lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

from batchserve.backends.base import Backend
from batchserve.backends.selection import create_backend
from batchserve.core.device import CPU, Device
from batchserve.core.errors import BatchserveError, ModelConfigError, Unavailable
from batchserve.devices.placement import gpu_count, resolve_devices
from batchserve.models.decoupled import build_responder, builtin_backend
from batchserve.models.load_override import LoadOverride, OverrideDirectory
from batchserve.models.memory_probe import probe_backend
from batchserve.models.model_directory import ModelVersion, ResolvedModel
from batchserve.models.model_table import InstanceMemory, ModelState, ModelTable, ServedVersion
from batchserve.models.repository import ModelRepository
from batchserve.models.warmup import synthetic_batch
from batchserve.models.warmup_samples import WarmupSample, read_warmup_samples
from batchserve.observability.stats import ModelStats
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.inline import INLINE_BELOW_NS
from batchserve.scheduler.instances import Instance, InstancePool
from batchserve.scheduler.memory import MemoryBudgets, ModelReservations
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.sequences import MAX_LIVE_SEQUENCES, SequenceBatcher, SequencePolicy

logger = logging.getLogger(__name__)

BackendFactory = Callable[[ModelConfig, Path], Backend]

# Dynamic non-batch axes (sequence length, image size) are probed at this size for models
# with a sequence-length input, and at 1 otherwise: memory then scales with the real
# lengths, which the cap cannot foresee; a batch that still runs out is split (OOM split).
PROBE_SEQUENCE_LENGTH = 128


def probe_length(config: ModelConfig) -> int:
    return PROBE_SEQUENCE_LENGTH if config.batchserve.sequence_length_input else 1


async def _run_sample(instance: Instance, sample: WarmupSample) -> None:
    """Run one ``model_warmup`` sample ``count`` times, and log it; a failure names it, in
    Triton's words."""
    started = time.perf_counter()
    try:
        for _ in range(sample.count):
            await instance.run(partial(instance.backend.infer, sample.inputs))
    except BatchserveError as exc:
        raise ModelConfigError(
            f"failed to run warmup sample '{sample.name}': {exc.message}"
        ) from exc
    logger.info(
        "warm-up sample run",
        extra={"instance": instance.name, "sample": sample.name, "count": sample.count,
               "ms": round((time.perf_counter() - started) * 1000, 1)},
    )  # fmt: skip


SLOW_PHASE_S = 1.0
"""A load phase (memory probe, warm-up) longer than this is logged at info level, so that a
person watching a slow load sees where its time goes; shorter ones at debug."""


def _log_phase(instance: str, phase: str, started: float) -> None:
    seconds = time.perf_counter() - started
    level = logging.INFO if seconds >= SLOW_PHASE_S else logging.DEBUG
    logger.log(
        level,
        "load phase done",
        extra={"instance": instance, "phase": phase, "seconds": round(seconds, 2)},
    )


def _remove_files_of(
    resolving: asyncio.Future[tuple[ResolvedModel, OverrideDirectory | None]],
) -> None:
    """A load cancelled while its files were being written: remove them once written."""
    if resolving.cancelled() or resolving.exception() is not None:
        return
    files = resolving.result()[1]
    if files is not None:
        asyncio.get_running_loop().run_in_executor(None, files.remove)


class ModelRegistry(ModelTable):
    """Owns every loaded model; the dataplane's only way to reach one."""

    def __init__(
        self,
        repository: ModelRepository,
        max_queue_size: int,
        budgets: MemoryBudgets,
        backend_factory: BackendFactory = create_backend,
        after_change: Callable[[], None] = lambda: None,
    ) -> None:
        """``after_change`` runs once a load or unload has finished swapping models (the
        server settles its heap there: ``gc_tuning.settle``)."""
        super().__init__(repository)
        self.budgets = budgets
        self.load_seconds: dict[str, float] = {}  # latest load of each model, however started
        self._max_queue_size = max_queue_size
        self._backend_factory = backend_factory
        self._after_change = after_change

    async def load(self, name: str, override: LoadOverride | None = None) -> None:
        """Load (or reload) every served version of a model; failures leave it UNAVAILABLE.

        ``override`` (a load's parameters) replaces the repository's config, or its whole
        directory, for this load only: a later plain load reads the repository again.
        """
        started = time.monotonic()
        files = None
        resolving = asyncio.ensure_future(asyncio.to_thread(self._resolve, name, override))
        try:
            resolved, files = await asyncio.shield(resolving)
        except asyncio.CancelledError:  # the thread goes on writing the load's files
            resolving.add_done_callback(_remove_files_of)
            raise
        except ModelConfigError as exc:  # in the repository, but broken: say why when asked
            failed = self._entry(name)
            if failed.state is not ModelState.READY:
                failed.state, failed.reason = ModelState.UNAVAILABLE, exc.message
            raise
        entry = self._entry(resolved.name)
        try:
            async with entry.lock:
                if entry.state is not ModelState.READY:
                    entry.state, entry.reason = ModelState.LOADING, ""
                try:
                    versions = await self._load_versions(resolved)
                except BatchserveError as exc:
                    entry.state, entry.reason = ModelState.UNAVAILABLE, exc.message
                    raise
                old, entry.versions = entry.versions, versions
                old_files, entry.files, files = entry.files, files, None
                entry.state, entry.reason = ModelState.READY, ""
                self.load_seconds[resolved.name] = time.monotonic() - started
        finally:
            if files is not None:
                await asyncio.to_thread(files.remove)
        try:
            for served in old.values():
                await served.close()
        finally:
            if old_files is not None:
                await asyncio.to_thread(old_files.remove)
        self._after_change()
        logger.info("model ready", extra={"model": name, "versions": sorted(versions)})

    def _resolve(
        self, name: str, override: LoadOverride | None
    ) -> tuple[ResolvedModel, OverrideDirectory | None]:
        """The model to load: from the repository, or from the load's own files."""
        if override is None or not override.files:
            config = override.config if override is not None else None
            return self.repository.resolve(name, config), None
        files = OverrideDirectory(name, override.files)
        try:
            return ModelRepository(files.root).resolve(name, override.config), files
        except BaseException:
            files.remove()
            raise

    async def _load_versions(self, resolved: ResolvedModel) -> dict[int, ServedVersion]:
        loaded: dict[int, ServedVersion] = {}
        try:
            for version in resolved.versions:
                loaded[version.version] = await self._load_version(resolved, version)
        except BaseException:
            for served in loaded.values():
                await served.close()
            raise
        return loaded

    async def _load_version(self, resolved: ResolvedModel, version: ModelVersion) -> ServedVersion:
        config = resolved.config
        if builtin_backend(config) is not None:
            return await self._load_decoupled(resolved, version)
        samples = await asyncio.to_thread(
            read_warmup_samples,
            config,
            resolved.directory or self.repository.root / resolved.name,
            source=resolved.config_file,
        )
        reservations = ModelReservations.from_config(config)
        instances: list[Instance] = []
        memory: list[InstanceMemory] = []
        try:
            for index, device in enumerate(resolve_devices(config, gpu_count())):
                name = f"{resolved.name}-{version.version}-{index}"
                instance, used = await self._load_instance(
                    name, config, version, device, reservations, samples
                )
                instances.append(instance)
                memory.append(used)
        except BaseException:
            await asyncio.to_thread(InstancePool(instances).close)
            reservations.release()
            raise
        objective_ns = config.batchserve.latency_objective_microseconds * 1000
        stats = ModelStats(latency_objective_ns=objective_ns)
        policy = BatchPolicy.from_config(config, self._max_queue_size)
        if config.max_batch_size > 0:
            policy = replace(policy, max_batch_size=min(m.batch_cap for m in memory))
        pad = config.batchserve.padding_value
        pool = InstancePool(instances)
        sequences = SequencePolicy.from_config(config)
        batcher: Batcher
        if sequences is None:
            batcher = Batcher(pool, policy, stats, pad_value=pad, inline_below_ns=INLINE_BELOW_NS)
        else:
            try:
                live = reservations.reserve_rows(
                    self.budgets.for_device(CPU), sequences.state_bytes, MAX_LIVE_SEQUENCES
                )
            except BaseException:
                await asyncio.to_thread(pool.close)
                reservations.release()
                raise
            batcher = SequenceBatcher(
                resolved.name, pool, policy, stats, sequences, max_live=live.batch_cap,
                pad_value=pad, inline_below_ns=INLINE_BELOW_NS,
            )  # fmt: skip
        for instance, used in zip(instances, memory, strict=True):
            runs = [(s.batch_size, s.run_ns) for s in used.profile.samples if s.run_ns]
            batcher.seed_batch_times(instance.name, runs)
        return ServedVersion(
            resolved.name,
            version.version,
            config,
            batcher,
            stats,
            tuple(memory),
            reservations,
            resolved.labels,
        )

    async def _load_decoupled(
        self, resolved: ResolvedModel, version: ModelVersion
    ) -> ServedVersion:
        """A decoupled model of a built-in backend: a responder, no instances of its own."""
        config = resolved.config
        step_name = config.parameters["step_model"].string_value
        step_config = None  # checked against the step model as the repository holds it
        if step_name:
            with contextlib.suppress(BatchserveError):
                step_config = (await asyncio.to_thread(self.repository.resolve, step_name)).config
        directory = resolved.directory or self.repository.root / resolved.name
        responder = build_responder(config, directory, self._step_batcher, step_config)
        stats = ModelStats()
        policy = BatchPolicy.from_config(config, self._max_queue_size)
        batcher = Batcher(InstancePool([]), policy, stats)
        return ServedVersion(resolved.name, version.version, config, batcher, stats,
                             responder=responder)  # fmt: skip

    def _step_batcher(self, name: str) -> SequenceBatcher:
        """A generation model's step model, as loaded now: its sequence batcher."""
        batcher = self.get(name, "").batcher
        if not isinstance(batcher, SequenceBatcher):
            raise Unavailable(f"step model '{name}' has no sequence batcher")
        return batcher

    async def _load_instance(
        self,
        name: str,
        config: ModelConfig,
        version: ModelVersion,
        device: Device,
        reservations: ModelReservations,
        samples: tuple[WarmupSample, ...] = (),
    ) -> tuple[Instance, InstanceMemory]:
        """Load, measure, reserve, then warm up (the config's ``model_warmup`` samples, as
        Triton runs them, then a batch at the derived cap): ready means all four."""
        backend = self._backend_factory(config, version.model_file)
        instance = Instance(name, backend)
        free_dim = probe_length(config)
        first = samples[0].inputs if samples else None
        try:
            allowance = reservations.allowance(self.budgets.for_device(device))
            started = time.perf_counter()
            profile = await instance.run(
                partial(probe_backend, backend, version.model_file, config, device,
                        limit_bytes=allowance, free_dim=free_dim, sample=first)
            )  # fmt: skip
            _log_phase(name, "load and memory probe", started)
            reservation = reservations.reserve(self.budgets.for_device(backend.device), profile)
            cap = reservation.batch_cap if config.max_batch_size > 0 else 1
            started = time.perf_counter()
            for sample in samples:
                await _run_sample(instance, sample)
            batch = synthetic_batch(config, cap, free_dim, first)
            await instance.run(partial(backend.infer, batch))
            _log_phase(name, "warm-up", started)
        except BaseException:
            await asyncio.to_thread(instance.close)
            raise
        logger.info(
            "instance loaded",
            extra={"model": config.name, "version": version.version, "instance": name,
                   "device": str(backend.device), "batch_cap": cap,
                   "fixed_bytes": profile.fixed_bytes, "per_sample_bytes": profile.per_sample_bytes,
                   "reserved_bytes": reservation.nbytes},
        )  # fmt: skip
        used = InstanceMemory(backend.device, profile, reservation.nbytes, cap)
        return instance, used

    async def unload(self, name: str) -> None:
        """Stop taking requests for a model, finish those accepted, release it."""
        entry = self._entries.get(name)
        if entry is None or (entry.state is ModelState.UNAVAILABLE and not entry.versions):
            # As Triton: unloading what is not loaded changes nothing and succeeds
            logger.info("unload of a model not loaded", extra={"model": name})
            return
        async with entry.lock:
            entry.state, entry.reason = ModelState.UNLOADING, ""
            old, entry.versions = entry.versions, {}
            old_files, entry.files = entry.files, None
            for served in old.values():
                await served.close()
            if old_files is not None:
                await asyncio.to_thread(old_files.remove)
            entry.state, entry.reason = ModelState.UNAVAILABLE, "unloaded"
        self._after_change()
        logger.info("model unloaded", extra={"model": name})

    async def close(self) -> None:
        """Drain and release every model, logging what each version answered in its life."""
        for name, entry in list(self._entries.items()):
            versions = list(entry.versions.values())
            if versions:
                await self.unload(name)
            for served in versions:
                stats = served.stats
                logger.info(
                    "final statistics",
                    extra={"model": name, "version": served.version,
                           "success": stats.success.count, "fail": stats.fail.count,
                           "inference_count": stats.inference_count,
                           "execution_count": stats.execution_count},
                )  # fmt: skip
