"""The models this server holds: loading, readiness and unloading (lookup: ``model_table``).

Loading happens off the event loop; a model is READY only once every instance is loaded
and has run a warm-up batch. Reloading builds the new versions first and swaps them in,
so requests in flight on the old ones finish and none are lost; a reload that changes only
``instance_group`` changes the served versions' instances instead (``instance_change``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from batchserve.backends.selection import create_backend
from batchserve.core.device import CPU
from batchserve.core.errors import (
    BackendError,
    BatchserveError,
    InvalidArgument,
    ModelConfigError,
    ModelFileError,
    Unavailable,
    triton_code,
)
from batchserve.core.metrics_config import TRITON_DEFAULTS, MetricsConfig
from batchserve.devices.placement import Placement
from batchserve.models.decoupled import build_responder, builtin_backend, step_model
from batchserve.models.ensemble import EnsembleBatcher
from batchserve.models.ensemble_config import answers_many, is_ensemble
from batchserve.models.ensemble_flow import EnsembleResponder
from batchserve.models.ensemble_loading import (
    EnsembleDependencies,
    composing_configs,
    inherited_labels,
)
from batchserve.models.initial_states import read_initial_states
from batchserve.models.instance_change import change_instances, reload_reason
from batchserve.models.instance_loader import BackendFactory as BackendFactory  # re-exported
from batchserve.models.instance_loader import InstanceLoader, active_instances
from batchserve.models.load_override import LoadOverride, OverrideDirectory
from batchserve.models.measured_defaults import Subject, Tuning, configured, log_tuning, tune
from batchserve.models.model_directory import ModelVersion, ResolvedModel
from batchserve.models.model_metrics import uncustomizable_family_warnings
from batchserve.models.model_table import (
    UNLOADED,
    LoadedInstance,
    ModelEntry,
    ModelState,
    ModelTable,
    ServedVersion,
)
from batchserve.models.placing import placements as place
from batchserve.models.repository import ModelRepository
from batchserve.models.warmup import synthetic_batch
from batchserve.models.warmup_samples import WarmupSample, read_warmup_samples
from batchserve.observability.latency_summaries import LatencySummaries, first_response_buckets
from batchserve.observability.stats import ModelStats
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.inline import INLINE_BELOW_NS
from batchserve.scheduler.instances import InstancePool
from batchserve.scheduler.memory import (
    MemoryBudgets,
    ModelReservations,
    fewest_positions,
    probe_length,
)
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.rate_limiter import RateLimiter
from batchserve.scheduler.response_cache import ResponseCache
from batchserve.scheduler.sequences import MAX_LIVE_SEQUENCES, SequenceBatcher, SequencePolicy

logger = logging.getLogger(__name__)
_LOADS = itertools.count()
"""Numbers each load of a model version, so that response cache keys never span two."""

MEASURED_EACH_PLACEMENT = 2
"""Instances of one placement measured before the rest load on the last one's profile: the
first a process loads pays its runtime's one-time costs (a ResNet-18-like CNN's first of
four reserved 323 MB, the others 266-280 MB), which the second does not."""


def _with_served_choice(entry: ModelEntry, resolved: ResolvedModel) -> ResolvedModel:
    """``resolved`` with the instances and threads its served version measured, where both
    leave them to the server: reloading an unchanged config then keeps the measured choice
    instead of taking it for a change of instances (a changed config is measured anew)."""
    served = entry.versions.get(max(entry.versions, default=0))
    if not resolved.tunable or served is None or served.tuning is None:
        return resolved
    return replace(resolved, config=configured(resolved.config, served.tuning.chosen))


def _remove_files_of(
    resolving: asyncio.Future[tuple[ResolvedModel, OverrideDirectory | None]],
) -> None:
    """A load cancelled while its files were being written: remove them once written."""
    if resolving.cancelled() or resolving.exception() is not None:
        return
    files = resolving.result()[1]
    if files is not None:
        asyncio.get_running_loop().run_in_executor(None, files.remove)


def load_error(model: str, error: Exception) -> BatchserveError:
    """A load's failure as the index and the client see it, once its config was read:
    batchserve's own error as it is, a refusal of the model's files or of their runtime as a
    ModelFileError (Triton's "load failed", not a repository poll failure); anything else a
    runtime or numpy raises (a MemoryError for inputs a config declares too large) as a
    BackendError naming it, so that one model's load can neither stop the server nor leave
    the model LOADING."""
    if isinstance(error, InvalidArgument) and not isinstance(error, ModelFileError):
        return ModelFileError(error.message)
    if isinstance(error, BatchserveError):
        return error
    text = " ".join(str(error).split())[:300]
    return BackendError(f"model '{model}' failed to load: {type(error).__name__}: {text}")


def _at_version(error: BatchserveError, version: int) -> BatchserveError:
    """A version's failed load as Triton words it ("version 2 is at UNAVAILABLE state:
    Internal: ...;"), which its lifecycle and error-propagation tests read."""
    error.message = (
        f"version {version} is at {ModelState.UNAVAILABLE.value} state: "
        f"{triton_code(error)}: {error.message};"
    )
    error.args = (error.message,)
    return error


class ModelRegistry(ModelTable):
    """Owns every loaded model; the dataplane's only way to reach one."""

    def __init__(
        self,
        repository: ModelRepository,
        max_queue_size: int,
        budgets: MemoryBudgets,
        backend_factory: BackendFactory = create_backend,
        after_change: Callable[[], None] = lambda: None,
        cpus: int = 1,
        metrics: MetricsConfig = TRITON_DEFAULTS,
        response_cache: ResponseCache | None = None,
        rate_limiter: RateLimiter | None = None,
        wait_out_queue_delay: bool = False,
        delay_scheduler: int = 0,
        backlog_delay_scheduler: int = 0,
    ) -> None:
        """``after_change`` runs once a load or unload has finished swapping models (the
        server settles its heap there: ``gc_tuning.settle``); ``cpus``: the cores models may
        use, which measured defaults choose instances and threads for, and the most instances
        that load at once on a measured twin's profile."""
        super().__init__(repository)
        self.budgets = budgets
        self.load_seconds: dict[str, float] = {}  # latest load of each model, however started
        self._max_queue_size = max_queue_size
        self._wait_out_queue_delay = wait_out_queue_delay
        """``--wait-out-queue-delay``: every model's batches wait their whole delay."""
        self._delay_scheduler = delay_scheduler
        """``--delay-scheduler``: each batcher holds its first batch until this many queued."""
        self._backlog_delay_scheduler = backlog_delay_scheduler
        """``--backlog-delay-scheduler``: a sequence model's hold waits for its backlog too."""
        self._loader = InstanceLoader(budgets, backend_factory)
        self._after_change = after_change
        self._cpus = cpus
        self._metrics = metrics
        self._response_cache = response_cache
        """Triton's local cache (``--cache-config``), for models that enable it."""
        self._rate_limiter = rate_limiter
        """Triton's rate limiter (``--rate-limit execution_count``), shared by every model."""
        self._dependencies = EnsembleDependencies()

    async def load(self, name: str, override: LoadOverride | None = None) -> None:
        """Load (or reload) every served version of a model. A failed first load leaves it
        UNAVAILABLE; a failed reload leaves the versions loaded before serving.

        ``override`` (a load's parameters) replaces the repository's config, or its whole
        directory, for this load only: a later plain load reads the repository again. A
        reload whose config differs only in ``instance_group``, of unchanged files, changes
        the loaded versions' instances (``instance_change``) instead of rebuilding them.
        """
        started = time.monotonic()
        self._dependencies.asked_for(name)
        resolved, files = await self._resolve_for_load(name, override)
        entry = self._entry(resolved.name)
        old: dict[int, ServedVersion] = {}
        old_files = None
        try:
            async with entry.lock:
                as_served = _with_served_choice(entry, resolved)
                if files is None and self._only_instances_change(entry, as_served):
                    await self._change_instances(entry, as_served)
                else:
                    old, old_files = await self._swap_versions(entry, resolved, files)
                    files = None  # the entry's now
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
        logger.info(
            "model ready",
            extra={"model": name, "versions": sorted(entry.versions),
                   "config": resolved.config_file},
        )  # fmt: skip

    async def _resolve_for_load(
        self, name: str, override: LoadOverride | None
    ) -> tuple[ResolvedModel, OverrideDirectory | None]:
        resolving = asyncio.ensure_future(asyncio.to_thread(self._resolve, name, override))
        try:
            return await asyncio.shield(resolving)
        except asyncio.CancelledError:  # the thread goes on writing the load's files
            resolving.add_done_callback(_remove_files_of)
            raise
        except BatchserveError as exc:
            if isinstance(exc, ModelConfigError):  # in the repository, but broken: say why
                self._mark_unavailable(name, exc)
            raise
        except Exception as exc:  # reading the repository failed in a way none foresaw
            error = load_error(name, exc)
            self._mark_unavailable(name, error)
            raise error from exc

    def _mark_unavailable(self, name: str, error: BatchserveError) -> None:
        """A model whose files cannot be loaded: UNAVAILABLE with the reason, unless a
        version loaded before still serves."""
        failed = self._entry(name)
        if failed.state is not ModelState.READY:
            failed.state, failed.reason = ModelState.UNAVAILABLE, error.message

    @staticmethod
    def _only_instances_change(entry: ModelEntry, resolved: ResolvedModel) -> bool:
        """Whether loading ``resolved`` need only change the served versions' instances."""
        if entry.state is not ModelState.READY or not entry.versions or entry.files is not None:
            return False
        reason = reload_reason(entry.versions, resolved)
        if reason is not None:
            logger.info("model reloaded whole", extra={"model": entry.name, "reason": reason})
        return reason is None

    async def _swap_versions(
        self, entry: ModelEntry, resolved: ResolvedModel, files: OverrideDirectory | None
    ) -> tuple[dict[int, ServedVersion], OverrideDirectory | None]:
        """Build the new versions, then put them (and their files) in the old ones' place;
        returns the old ones, for the caller to close once no longer holding the lock."""
        serving = entry.state is ModelState.READY and bool(entry.versions)
        if not serving:
            entry.state, entry.reason = ModelState.LOADING, ""
        try:
            versions = await self._load_versions(resolved)
        except Exception as exc:  # as Triton: a failed reload leaves the model served
            error = load_error(resolved.name, exc)
            entry.state = ModelState.READY if serving else ModelState.UNAVAILABLE
            entry.reason = error.message
            if error is exc:
                raise
            raise error from exc
        old = entry.replace_versions(versions)
        old_files, entry.files = entry.files, files
        entry.state, entry.reason = ModelState.READY, ""
        return old, old_files

    async def change_instances(self, name: str, config: ModelConfig) -> None:
        """Give a ready model the instances ``config`` places while it keeps serving;
        ``config`` is the model's own (completed) config with another ``instance_group``."""
        self.get(name)  # ready, or raise as a request would be answered
        entry = self._entries[name]
        async with entry.lock:
            sources = [served.source for _, served in sorted(entry.versions.items())]
            labels = entry.versions[max(entry.versions)].labels
            if any(source is None for source in sources):
                raise ModelConfigError(f"model '{name}' has no instances of its own to change")
            versions = tuple(source for source in sources if source is not None)
            directory = versions[0].model_file.parent.parent
            resolved = ResolvedModel(name, config, versions, labels, directory, f"{name}: change")
            if not self._only_instances_change(entry, resolved):
                raise ModelConfigError(f"model '{name}': only instance_group may change in place")
            await self._change_instances(entry, resolved)
        self._after_change()

    async def _change_instances(self, entry: ModelEntry, resolved: ResolvedModel) -> None:
        """``instance_change.change_instances`` with this registry's loader; a refusal
        leaves the versions serving as before, READY, with the reason in the index."""
        samples: tuple[WarmupSample, ...] = ()

        async def load(served: ServedVersion, name: str, placement: Placement) -> LoadedInstance:
            assert served.source is not None
            assert served.reservations is not None
            same = [i.memory for i in served.instances if i.placement == placement]
            twin = same[-1] if len(same) >= MEASURED_EACH_PLACEMENT else None
            return await self._loader.load(
                name, resolved.config, served.source, placement, served.reservations, samples,
                twin=twin,
            )  # fmt: skip

        async def close(served: ServedVersion, loaded: LoadedInstance) -> None:
            assert served.reservations is not None
            await self._loader.close(loaded, served.reservations)

        def check(
            served: ServedVersion, measured: list[LoadedInstance], rest: list[Placement]
        ) -> None:
            assert served.reservations is not None
            self._loader.check_room(measured, rest, served.reservations)

        try:
            samples = await self._warmup_samples(resolved)
            await change_instances(
                list(entry.versions.values()), resolved.config, load, close, check
            )
        except Exception as exc:
            error = load_error(resolved.name, exc)
            entry.reason = error.message
            if error is exc:
                raise
            raise error from exc
        entry.reason = ""
        if not resolved.tunable:  # the config now chooses its instances: nothing measured holds
            for served in entry.versions.values():
                served.tuning = None

    def _directory_of(self, resolved: ResolvedModel) -> Path:
        """Where the model's own files (warm-up data, initial states) are read from."""
        if resolved.directory is not None:
            return resolved.directory
        [directory] = self.repository.directories(resolved.name)
        return directory

    async def _warmup_samples(self, resolved: ResolvedModel) -> tuple[WarmupSample, ...]:
        directory = self._directory_of(resolved)
        return await asyncio.to_thread(
            read_warmup_samples, resolved.config, directory, source=resolved.config_file
        )

    async def _initial_states(self, resolved: ResolvedModel) -> dict[str, np.ndarray]:
        directory = self._directory_of(resolved)
        return await asyncio.to_thread(
            read_initial_states, resolved.config, directory, source=resolved.config_file
        )

    def _resolve(
        self, name: str, override: LoadOverride | None
    ) -> tuple[ResolvedModel, OverrideDirectory | None]:
        """The model to load: from the repository, or from the load's own files."""
        if override is None or not override.files:
            config = override.config if override is not None else None
            return self.repository.resolve(name, config), None
        files = OverrideDirectory(name, override.files)
        try:
            own = ModelRepository(
                files.root,
                auto_complete=self.repository.auto_complete,
                backend_config=self.repository.backend_config,
            )
            return own.resolve(name, override.config), files
        except BaseException:
            files.remove()
            raise

    async def _load_versions(self, resolved: ResolvedModel) -> dict[int, ServedVersion]:
        if is_ensemble(resolved.config):  # the model's failure, as Triton's, not a version's
            composing = await composing_configs(
                resolved.config, self._load_along, self.get, self._available
            )
            self._dependencies.ensemble_loaded(resolved.name, composing)
        loaded: dict[int, ServedVersion] = {}
        try:
            for version in resolved.versions:
                try:
                    loaded[version.version] = await self._load_version(resolved, version)
                except Exception as exc:
                    raise _at_version(load_error(resolved.name, exc), version.version) from exc
        except BaseException:
            for served in loaded.values():
                await served.close()
            raise
        return loaded

    async def _load_instances(
        self,
        name: str,
        config: ModelConfig,
        version: ModelVersion,
        samples: tuple[WarmupSample, ...],
        reservations: ModelReservations,
        by_index: dict[int, LoadedInstance],
    ) -> None:
        """Load a version's instances into ``by_index`` (by their place in the config): the
        first ``MEASURED_EACH_PLACEMENT`` of each placement measured, one after the other,
        then the rest on the profile of the last of those, together. Probes are serialised,
        so measuring every one-thread instance, one a core, made a load as long as the cores
        times a probe (four of a ResNet-18-like CNN on two cores: 18.6 s; ``bench/NOTES.md``)."""
        placements = place(config, version.model_file)
        measured_first: list[int] = []
        for index, placement in enumerate(placements):
            if sum(placements[i] == placement for i in measured_first) < MEASURED_EACH_PLACEMENT:
                measured_first.append(index)
        order = measured_first + [i for i in range(len(placements)) if i not in measured_first]
        measured: list[LoadedInstance] = []
        for position, index in enumerate(measured_first):
            loaded = await self._loader.load(
                f"{name}-{version.version}-{index}", config, version, placements[index],
                reservations, samples, len(order) - position,
            )  # fmt: skip
            by_index[index] = loaded
            measured.append(loaded)
            self._loader.check_room(
                measured, [placements[i] for i in order[position + 1 :]], reservations
            )
        twin = {loaded.placement: loaded.memory for loaded in measured}  # the last measured
        slots = asyncio.Semaphore(self._cpus)  # a load is CPU work: no more at once than cores

        async def load_twin(position: int, index: int) -> None:
            async with slots:
                by_index[index] = await self._loader.load(
                    f"{name}-{version.version}-{index}", config, version, placements[index],
                    reservations, samples, len(order) - position, twin[placements[index]],
                )  # fmt: skip

        loads = [load_twin(p, i) for p, i in enumerate(order) if p >= len(measured_first)]
        for result in await asyncio.gather(*loads, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    async def _load_version(self, resolved: ResolvedModel, version: ModelVersion) -> ServedVersion:
        if builtin_backend(resolved.config) is not None:
            return await self._load_decoupled(resolved, version)
        if is_ensemble(resolved.config):
            return await self._load_ensemble(resolved, version)
        return await self._load_with_instances(resolved, version)

    async def _load_with_instances(
        self, resolved: ResolvedModel, version: ModelVersion
    ) -> ServedVersion:
        samples = await self._warmup_samples(resolved)
        config, tuning = await self._measured(resolved, version, samples)
        reservations = ModelReservations.from_config(config)
        by_index: dict[int, LoadedInstance] = {}
        try:
            await self._load_instances(
                resolved.name, config, version, samples, reservations, by_index
            )
        except BaseException:
            await asyncio.to_thread(InstancePool([i.instance for i in by_index.values()]).close)
            reservations.release()
            raise
        loaded = [by_index[index] for index in sorted(by_index)]
        objective_ns = config.batchserve.latency_objective_microseconds * 1000
        stats = self._new_stats(config, objective_ns)
        policy = self._policy(config)
        if config.max_batch_size > 0:
            policy = replace(
                policy,
                max_batch_size=min(i.memory.batch_cap for i in loaded),
                max_batch_steps=fewest_positions(i.memory.batch_steps for i in loaded),
            )
        pad = config.batchserve.padding_value
        active = [i.instance for i in active_instances(loaded)]
        if self._rate_limiter is not None:
            problems = self._rate_limiter.problems(i.limits for i in active)
            if problems:
                await asyncio.to_thread(InstancePool([i.instance for i in loaded]).close)
                reservations.release()
                raise ModelConfigError("; ".join(problems))
        pool = InstancePool(active, self._rate_limiter)
        sequences = SequencePolicy.from_config(config, await self._initial_states(resolved))
        batcher: Batcher
        if sequences is None:
            batcher = Batcher(pool, policy, stats, pad_value=pad, inline_below_ns=INLINE_BELOW_NS)
            if config.response_cache.enable and self._response_cache is not None:
                batcher.cache = self._response_cache
                # each load its own keys: a reloaded version never answers from the old files
                batcher.cache_model = f"{resolved.name}\0{version.version}\0{next(_LOADS)}".encode()
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
        for one in loaded:
            batcher.seed_batch_times(one.instance.name, one.memory.timed_runs())
        return ServedVersion(
            resolved.name, version.version, config, batcher, stats, tuple(loaded), reservations,
            resolved.labels, source=version, tuning=tuning,
        )  # fmt: skip

    def _policy(self, config: ModelConfig) -> BatchPolicy:
        """How ``config``'s requests are batched, with the server's batching flags."""
        return BatchPolicy.from_config(
            config, self._max_queue_size, self._wait_out_queue_delay,
            delay_scheduler=self._delay_scheduler,
            backlog_delay_scheduler=self._backlog_delay_scheduler,
        )  # fmt: skip

    async def _measured(
        self, resolved: ResolvedModel, version: ModelVersion, samples: tuple[WarmupSample, ...]
    ) -> tuple[ModelConfig, Tuning | None]:
        """The config to load with: as resolved, or, where it leaves instances and threads
        to the server, with those measured (``measured_defaults``)."""
        config = resolved.config
        if not resolved.tunable:
            return config, None
        device = place(config, version.model_file, warn=False)[0].device  # the load says it
        first = samples[0].inputs if samples else None
        free_dim = probe_length(config)
        subject = Subject(
            config, version.model_file, device, self._loader.backend_factory,
            lambda rows: synthetic_batch(config, rows, free_dim, first),
        )  # fmt: skip
        graphs = device.kind == "gpu" and config.max_batch_size > 0
        tuning = await asyncio.to_thread(tune, subject, self._cpus, graphs_possible=graphs)
        log_tuning(resolved.name, tuning)
        return configured(config, tuning.chosen), tuning

    async def _load_decoupled(
        self, resolved: ResolvedModel, version: ModelVersion
    ) -> ServedVersion:
        """A model of a built-in backend (decoupled, or repeat and square without it): a
        responder, no instances of its own."""
        config = resolved.config
        step_name = step_model(config)
        step_config = None  # checked against the step model as the repository holds it
        if step_name:
            with contextlib.suppress(BatchserveError):
                step_config = (await asyncio.to_thread(self.repository.resolve, step_name)).config
        directory = self._directory_of(resolved)
        responder = build_responder(config, directory, self._step_batcher, step_config)
        stats = self._new_stats(config)
        policy = self._policy(config)
        batcher = Batcher(InstancePool([]), policy, stats)
        return ServedVersion(resolved.name, version.version, config, batcher, stats,
                             responder=responder)  # fmt: skip

    async def _load_ensemble(self, resolved: ResolvedModel, version: ModelVersion) -> ServedVersion:
        """An ensemble, its composing models loaded and its steps checked against them
        (``_load_versions``): its requests run through their batchers (``ensemble.py``)."""
        config = resolved.config
        stats = self._new_stats(config)
        policy = self._policy(config)
        batcher = EnsembleBatcher(config, policy, stats, self.get)
        labels = inherited_labels(config, resolved.labels, self.get)
        decoupled = [s for s in batcher.steps if answers_many(self.get(s.model, s.version).config)]
        # Triton's ensemble is decoupled exactly when a step is, whatever its config says, and
        # its served config says so either way (``model_transaction_policy {}`` when not)
        config = ModelConfig()
        config.CopyFrom(resolved.config)
        config.model_transaction_policy.decoupled = bool(decoupled)
        responder = EnsembleResponder(batcher, decoupled) if decoupled else None
        return ServedVersion(resolved.name, version.version, config, batcher, stats,
                             labels=labels, responder=responder)  # fmt: skip

    def named(self, name: str) -> None:
        """A start-up list names ``name``, which an ensemble loaded already: it is now the
        user's too, and ``unload_dependents`` leaves it (Triton marks every model of a
        start-up explicitly loaded)."""
        self._dependencies.asked_for(name)

    def _available(self, name: str) -> bool:
        """Loaded, or in the repository once: what an ensemble's step may name."""
        try:
            self.get(name, "")
            return True
        except BatchserveError:
            return len(self.repository.directories(name)) == 1

    async def _load_along(self, name: str) -> None:
        """Load a composing model an ensemble needs, which no one asked to load."""
        await self.load(name)
        self._dependencies.loaded_along(name)

    def _new_stats(self, config: ModelConfig, objective_ns: int = 0) -> ModelStats:
        """A version's statistics, with the latency families ``--metrics-config`` asks for."""
        for warning in uncustomizable_family_warnings(config):
            logger.warning("%s", warning)
        stats = ModelStats(latency_objective_ns=objective_ns)
        if self._metrics.summary_latencies:
            stats.summaries = LatencySummaries()
        if self._metrics.histogram_latencies:
            stats.first_response = first_response_buckets(config)
        return stats

    def _step_batcher(self, name: str) -> SequenceBatcher:
        """A generation model's step model, as loaded now: its sequence batcher."""
        batcher = self.get(name, "").batcher
        if not isinstance(batcher, SequenceBatcher):
            raise Unavailable(f"step model '{name}' has no sequence batcher")
        return batcher

    async def unload(self, name: str, dependents: bool = False) -> None:
        """Stop taking requests for a model, finish those accepted, release it; then the
        ensembles that use it, and with ``dependents`` (Triton's ``unload_dependents``) the
        composing models an ensemble alone kept loaded (``EnsembleDependencies``)."""
        await self._unload_one(name)
        for ensemble in self._dependencies.users_of(name):
            # as Triton: the error is logged, the ensemble unloaded like any model (its state
            # "unloaded", so that a strictly ready server stays ready)
            logger.error(
                "Invalid argument: ensemble '%s' depends on '%s' which has no loaded version.",
                ensemble, name,
            )  # fmt: skip
            await self._unload_one(ensemble)
            await self._unload_composing(ensemble, dependents)
        await self._unload_composing(name, dependents)

    async def _unload_composing(self, name: str, dependents: bool) -> None:
        alone = self._dependencies.unloaded(name)
        if dependents:
            for model in alone:
                await self.unload(model, dependents=True)

    async def _unload_one(self, name: str) -> None:
        entry = self._entries.get(name)
        if entry is None or (entry.state is ModelState.UNAVAILABLE and not entry.versions):
            # As Triton: unloading what is not loaded changes nothing and succeeds
            logger.info("unload of a model not loaded", extra={"model": name})
            return
        async with entry.lock:
            entry.state, entry.reason = ModelState.UNLOADING, ""
            old = entry.replace_versions({})
            old_files, entry.files = entry.files, None
            for served in old.values():
                await served.close()
            if old_files is not None:
                await asyncio.to_thread(old_files.remove)
            entry.state, entry.reason = ModelState.UNAVAILABLE, UNLOADED
        self._after_change()
        logger.info("model unloaded", extra={"model": name})

    async def close(self) -> None:
        """Drain and release every model, logging what each version answered in its life."""
        for name, entry in list(self._entries.items()):
            versions = list(entry.versions.values())
            if versions:
                await self._unload_one(name)
            for served in versions:
                stats = served.stats
                logger.info(
                    "final statistics",
                    extra={"model": name, "version": served.version,
                           "success": stats.success.count, "fail": stats.fail.count,
                           "inference_count": stats.inference_count,
                           "execution_count": stats.execution_count},
                )  # fmt: skip
