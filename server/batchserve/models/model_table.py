"""The table of models the server holds, and lookup in it by name and version.

Every request reads it (``ModelTable.get``); only the registry's load and unload write it,
so the read side lives here, apart from the lifecycle that fills it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from batchserve.core.datatypes import DataType, from_config
from batchserve.core.device import Device
from batchserve.core.digits import MAX_INT64_DIGITS, ascii_digits
from batchserve.core.errors import (
    BatchserveError,
    InvalidArgument,
    NotFound,
    Unavailable,
    VersionRetired,
)
from batchserve.core.validation import RequestSchema
from batchserve.devices.placement import Placement
from batchserve.models.labels import LabelMap
from batchserve.models.load_override import OverrideDirectory
from batchserve.models.measured_defaults import Tuning
from batchserve.models.model_directory import ModelVersion
from batchserve.models.repository import DUPLICATE_MODEL, ModelRepository
from batchserve.observability.stats import ModelStats
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.instances import Instance
from batchserve.scheduler.memory import MemoryProfile, ModelReservations, Reservation
from batchserve.scheduler.responders import Responder


class ModelState(StrEnum):
    """Triton's repository-index states."""

    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True, slots=True)
class InstanceMemory:
    """What one instance was measured to need, and what it reserved of its device's budget."""

    device: Device
    profile: MemoryProfile
    reserved_bytes: int
    batch_cap: int
    batch_steps: int = 0
    """Steps (rows times padded length) a batch may hold: a sequence model's; 0 otherwise."""
    probe_row_positions: int = 0
    """The positions each row of the probe's batches held; 0 for a model counted in rows."""

    def timed_runs(self) -> list[tuple[int, int]]:
        """The probe's timed batches as (work, ns), work as the batch-time models count it
        (``scheduler/batch_time.py``): samples, or positions for a model with free axes."""
        per_row = self.probe_row_positions or 1
        return [(s.batch_size * per_row, s.run_ns) for s in self.profile.samples if s.run_ns]


@dataclass(frozen=True, slots=True)
class LoadedInstance:
    """One instance of a served version: where ``instance_group`` placed it (``device``
    may differ: a GPU instance fallen back to the CPU), and the memory it holds."""

    instance: Instance
    placement: Placement
    memory: InstanceMemory
    reservation: Reservation


@dataclass(eq=False)
class ServedVersion:
    """One loaded version: its config, instances, scheduler and memory reservations.

    ``config`` and ``instances`` change together when its instances do (an instance change
    without a reload: ``instance_change.py``); the rest is fixed while it is loaded.
    """

    name: str
    version: int
    config: ModelConfig
    batcher: Batcher
    stats: ModelStats
    instances: tuple[LoadedInstance, ...] = ()
    reservations: ModelReservations | None = None
    labels: LabelMap = field(default_factory=dict)
    responder: Responder | None = None
    """A built-in backend's model's (decoupled, or repeat and square without it): its
    requests go there, not to ``batcher`` (which has no instances then)."""
    source: ModelVersion | None = None
    """The files it was loaded from (None: a decoupled model's, with none of its own)."""
    tuning: Tuning | None = None
    """What the load measured to choose instances and threads (``measured_defaults``), for
    a config that left them to the server; ``config`` holds the choice."""

    @property
    def memory(self) -> tuple[InstanceMemory, ...]:
        """What each instance measured and reserved, in the order they were loaded."""
        return tuple(loaded.memory for loaded in self.instances)

    @cached_property
    def schema(self) -> RequestSchema:
        """The config compiled for validating requests (once, not per request)."""
        return RequestSchema.of(self.config)

    @cached_property
    def output_types(self) -> dict[str, DataType]:
        """Each output's element type, as configured."""
        return {spec.name: from_config(spec.data_type) for spec in self.config.output}

    async def close(self) -> None:
        if self.responder is not None:
            await self.responder.close()
        await self.batcher.close()
        await asyncio.to_thread(self.batcher.pool.close)
        running = set(self.batcher.pool.instances)
        for loaded in self.instances:  # the passive ones, never in the pool
            if loaded.instance not in running:
                await asyncio.to_thread(loaded.instance.close)
        if self.reservations is not None:
            self.reservations.release()


@dataclass(eq=False)
class ModelEntry:
    """What the server knows of one model name, loaded or not."""

    name: str
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    versions: dict[int, ServedVersion] = field(default_factory=dict)
    retired: set[int] = field(default_factory=set)
    """Versions served once and no longer (unloaded, or left out by a later load): Triton
    keeps them, UNAVAILABLE, in its index, and a request for one is "not at ready state"."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    files: OverrideDirectory | None = None  # the load's own files, while they are served

    def replace_versions(self, versions: dict[int, ServedVersion]) -> dict[int, ServedVersion]:
        """Serve ``versions`` from now on; returns the ones they replace."""
        old, self.versions = self.versions, versions
        self.retired = (self.retired | old.keys()) - versions.keys()
        return old


UNLOADED = "unloaded"
"""The reason of a model unloaded on request (Triton's)."""


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of the repository index; a model never loaded has its name alone (no
    version, state or reason), as in Triton's index."""

    name: str
    version: str
    state: str
    reason: str


def unknown_model(name: str) -> NotFound:
    """Triton's text for a model it does not know, which its clients look for."""
    return NotFound(
        f"Request for unknown model: '{name}' is not found "
        f"(batchserve: no model '{name}' is loaded or in the repository)"
    )


def _version_number(version: str) -> int | None:
    """A request's version as a number (None: the highest served), parsed first as Triton
    does; a number too long to be one is -1, which no model serves."""
    if not version:
        return None
    if not ascii_digits(version):
        raise InvalidArgument(
            "failed to get model version from specified version string "
            f"'{version[:40]}' (batchserve: a version is a positive integer)"
        )
    return int(version) if len(version) <= MAX_INT64_DIGITS else -1


def _rows(entry: ModelEntry) -> list[IndexEntry]:
    """A model's index rows, as Triton lists them: each version served or retired by
    number, retired ones UNAVAILABLE "unloaded" beside those served, a model with no
    version by name alone. With nothing served, the retired versions carry the model's
    state (loading again, or failed)."""
    state, reason = entry.state.value, entry.reason
    if not entry.versions and not entry.retired:
        return [IndexEntry(entry.name, "", state, reason)]
    retired = (ModelState.UNAVAILABLE.value, UNLOADED) if entry.versions else (state, reason)
    return [
        IndexEntry(
            entry.name, str(number), *(retired if number in entry.retired else (state, reason))
        )
        for number in sorted(entry.versions.keys() | entry.retired)
    ]


class ModelTable:
    """Every model name the server has seen, with its state and served versions."""

    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self._entries: dict[str, ModelEntry] = {}

    def _entry(self, name: str) -> ModelEntry:
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = ModelEntry(name)
        return entry

    def get(self, name: str, version: str = "") -> ServedVersion:
        """The version to serve: the highest one when ``version`` is empty."""
        number = _version_number(version)
        entry = self._entries.get(name)
        # Triton's clients look for its "Request for unknown model" texts; the status stays
        # 503 where waiting can help (a model loading, or loadable).
        no_versions = f"Request for unknown model: '{name}' has no available versions"
        if entry is None:
            if self.knows(name):
                raise Unavailable(f"{no_versions} (batchserve: model '{name}' is not loaded)")
            raise unknown_model(name)
        detail = f": {entry.reason}" if entry.reason else ""
        not_ready = f"model '{name}' is not ready ({entry.state.value}{detail})"
        not_at_ready = f"Request for unknown model: '{name}' version {number} is not at ready state"
        if number in entry.retired:
            raise VersionRetired(f"{not_at_ready} (batchserve: no longer served)")
        if number in entry.versions and entry.state is not ModelState.READY:
            raise Unavailable(f"{not_at_ready} (batchserve: {not_ready})")
        if entry.state is not ModelState.READY:
            raise Unavailable(f"{no_versions} (batchserve: {not_ready})")
        if number is None:
            return entry.versions[max(entry.versions)]
        served = entry.versions.get(number)
        if served is None:
            shown = version[:40]
            raise NotFound(
                f"Request for unknown model: '{name}' version {shown} is not found "
                f"(batchserve: version '{shown}' of model '{name}' is not being served)"
            )
        return served

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.get(name, version)
        except BatchserveError:
            return False
        return True

    def knows(self, name: str) -> bool:
        """True for a model loaded now, once, or present in the repository."""
        return name in self._entries or bool(self.repository.directories(name))

    def versions_of(self, name: str) -> list[ServedVersion]:
        """The served versions of one ready model, ascending."""
        self.get(name)
        return [served for _, served in sorted(self._entries[name].versions.items())]

    def loaded(self) -> list[ServedVersion]:
        """Every version being served, by name then version."""
        return [
            served
            for name in sorted(self._entries)
            for _, served in sorted(self._entries[name].versions.items())
        ]

    def all_ready(self, expected: Iterable[str]) -> bool:
        """Triton's strict readiness: each of ``expected`` (the models loaded at start) has
        been tried, and every model tried is ready, or was unloaded on request. A model that
        failed its load, or is loading or unloading, is not ready; one an operator unloaded
        does not take the server out of service, as it did when every model loaded at start
        had to stay ready."""
        entries = self._entries
        return all(name in entries for name in expected) and all(
            entry.state is ModelState.READY
            or (entry.state is ModelState.UNAVAILABLE and entry.reason == UNLOADED)
            for entry in entries.values()
        )

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """The repository's models with their states, loaded or not; one never loaded (nor
        tried) by name alone, as Triton lists it."""
        rows: list[IndexEntry] = []
        duplicates = set(self.repository.duplicates())
        for name in sorted(set(self.repository.names()) | set(self._entries)):
            entry = self._entries.get(name)
            if name in duplicates:  # Triton's one row, whatever the model's state
                rows.append(IndexEntry(name, "", ModelState.UNAVAILABLE, DUPLICATE_MODEL))
            else:
                rows.extend(_rows(entry) if entry else [IndexEntry(name, "", "", "")])
        return [row for row in rows if row.state == ModelState.READY or not ready_only]
