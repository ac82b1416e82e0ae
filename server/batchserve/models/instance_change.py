"""Changing the instances of a live model without reloading it, as Triton does when a load
finds only ``instance_group`` changed (and the version's files unchanged).

Instances are matched by placement (device and group settings but count, Triton's instance
signature): those the new config still places are kept; each missing one is loaded, probed
and reserved in its device's memory budget *before* anything changes, so a change that does
not fit is refused and the version serves exactly as before. Then the new instances join
the batcher, the config is swapped, and the instances no longer wanted take no further batch,
finish the one they run, close and give their memory back. Requests, statistics and the
version itself carry on throughout.

Sequence models (live sequences hold slots of particular instances) and decoupled models
(whose responder has no instances) are reloaded whole instead: see ``reload_reason``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from batchserve.devices.placement import Placement
from batchserve.models.model_directory import ResolvedModel
from batchserve.models.model_table import LoadedInstance, ServedVersion
from batchserve.models.placing import placements as place
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.scheduler.memory import fewest_positions
from batchserve.scheduler.sequences import SequenceBatcher

logger = logging.getLogger(__name__)

LoadOne = Callable[[ServedVersion, str, Placement], Awaitable[LoadedInstance]]
"""Load one instance of a served version, named, where placed (``InstanceLoader.load``)."""
CloseOne = Callable[[ServedVersion, LoadedInstance], Awaitable[None]]
"""Unload one instance that runs no batch, and give its memory back."""
CheckRoom = Callable[[ServedVersion, list[LoadedInstance], list[Placement]], None]
"""Raises when the instances still to load (the list of placements) cannot fit beside those
measured (``InstanceLoader.check_room``)."""


def only_instances_differ(old: ModelConfig, new: ModelConfig) -> bool:
    """Whether the configs differ in ``instance_group`` alone (Triton also lets the version
    policy differ: which versions it selects is checked apart)."""
    old_rest, new_rest = ModelConfig(), ModelConfig()
    old_rest.CopyFrom(old)
    new_rest.CopyFrom(new)
    for config in (old_rest, new_rest):
        config.ClearField("instance_group")
        config.ClearField("version_policy")
    return old_rest == new_rest


def reload_reason(served: Mapping[int, ServedVersion], resolved: ResolvedModel) -> str | None:
    """Why loading ``resolved`` must rebuild the served versions; None when changing their
    instances is enough."""
    if sorted(served) != [v.version for v in resolved.versions]:
        return "the versions served change"
    for version in resolved.versions:
        current = served[version.version]
        if current.responder is not None:
            return "a decoupled model's responder is rebuilt whole"
        if isinstance(current.batcher, SequenceBatcher):
            return "live sequences hold slots of particular instances"
        source = current.source
        if source is None or source.model_file != version.model_file:
            return "the model file changed"
        if source.stamp != version.stamp:
            return f"the files of version {version.version} changed"
        if current.labels != resolved.labels:
            return "the labels changed"
        if not only_instances_differ(current.config, resolved.config):
            return "the config changed beyond instance_group"
        if any(group.passive for config in (current.config, resolved.config)
               for group in config.instance_group):  # fmt: skip
            return "passive instances are set apart at load"
    return None


@dataclass(frozen=True, slots=True)
class InstancePlan:
    """Which loaded instances stay, which go, and where new ones are needed."""

    keep: tuple[LoadedInstance, ...]
    remove: tuple[LoadedInstance, ...]
    add: tuple[Placement, ...]


def plan_instances(current: Sequence[LoadedInstance], wanted: Sequence[Placement]) -> InstancePlan:
    """Each wanted placement keeps a loaded instance of that placement while one is left
    (the earliest loaded first), else asks for a new one; those left over are removed."""
    free: dict[Placement, list[LoadedInstance]] = {}
    for loaded in current:
        free.setdefault(loaded.placement, []).append(loaded)
    keep: list[LoadedInstance] = []
    add: list[Placement] = []
    for placement in wanted:
        same = free.get(placement)
        if same:
            keep.append(same.pop(0))
        else:
            add.append(placement)
    remove = [loaded for left in free.values() for loaded in left]
    return InstancePlan(tuple(keep), tuple(remove), tuple(add))


def _new_names(served: ServedVersion, count: int) -> list[str]:
    """Instance names not in use, in the registry's ``<model>-<version>-<n>`` form."""
    taken = {loaded.instance.name for loaded in served.instances}
    names = (f"{served.name}-{served.version}-{n}" for n in range(len(taken) + count + 1))
    return [name for name in names if name not in taken][:count]


class InstanceChange:
    """A served version's new instances, loaded and reserved but not serving yet.

    ``commit`` puts them in and retires those the new config drops; ``abandon`` unloads
    them, leaving the version as it was.
    """

    def __init__(
        self,
        served: ServedVersion,
        config: ModelConfig,
        plan: InstancePlan,
        added: list[LoadedInstance],
        close: CloseOne,
    ) -> None:
        self.served = served
        self.config = ModelConfig()
        self.config.CopyFrom(config)  # the served version's from now: nobody else's to change
        self.plan = plan
        self.added = added
        self._close = close

    @classmethod
    async def prepare(
        cls,
        served: ServedVersion,
        config: ModelConfig,
        load: LoadOne,
        close: CloseOne,
        check: CheckRoom,
    ) -> InstanceChange:
        """Load what ``config`` places beyond the instances ``served`` has (raises, with
        nothing left loaded, when an instance cannot be placed, loaded or reserved)."""
        source = served.source.model_file if served.source is not None else None
        plan = plan_instances(served.instances, place(config, source))
        added: list[LoadedInstance] = []
        try:
            names = _new_names(served, len(plan.add))
            for index, (name, placement) in enumerate(zip(names, plan.add, strict=True)):
                added.append(await load(served, name, placement))
                check(served, [*served.instances, *added], list(plan.add[index + 1 :]))
        except BaseException:
            await asyncio.gather(*(close(served, loaded) for loaded in added))
            raise
        return cls(served, config, plan, added, close)

    async def abandon(self) -> None:
        await asyncio.gather(*(self._close(self.served, loaded) for loaded in self.added))
        self.added = []

    async def commit(self) -> None:
        """Serve on the new instances and config; return once the removed ones are closed."""
        served, batcher = self.served, self.served.batcher
        for loaded in self.added:
            batcher.add_instance(loaded.instance, loaded.memory.timed_runs())
        served.instances = (*self.plan.keep, *self.added)
        served.config = self.config
        if self.config.max_batch_size > 0:
            batcher.set_max_batch_size(
                min(i.memory.batch_cap for i in served.instances),
                fewest_positions(i.memory.batch_steps for i in served.instances),
            )
        retiring = asyncio.gather(*(self._retire(loaded) for loaded in self.plan.remove))
        try:
            await asyncio.shield(retiring)
        except asyncio.CancelledError:  # the caller gave up: still close what was removed
            await retiring
            raise
        changed = bool(self.added or self.plan.remove)
        logger.info(
            "instances changed without a reload" if changed else "model already as configured",
            extra={"model": served.name, "version": served.version,
                   "added": [i.instance.name for i in self.added],
                   "removed": [i.instance.name for i in self.plan.remove],
                   "instances": len(served.instances), "batch_cap": batcher.cap},
        )  # fmt: skip

    async def _retire(self, loaded: LoadedInstance) -> None:
        await self.served.batcher.remove_instance(loaded.instance)
        await self._close(self.served, loaded)


async def change_instances(
    versions: Sequence[ServedVersion],
    config: ModelConfig,
    load: LoadOne,
    close: CloseOne,
    check: CheckRoom,
) -> None:
    """Give every version the instances ``config`` places, or, when any version's new
    instances cannot all be loaded, change none and raise why."""
    prepared: list[InstanceChange] = []
    try:
        for served in versions:
            prepared.append(await InstanceChange.prepare(served, config, load, close, check))
    except BaseException:
        await asyncio.gather(*(change.abandon() for change in prepared))
        raise
    for change in prepared:
        await change.commit()
