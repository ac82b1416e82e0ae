"""Triton's poll mode (``--model-control-mode poll``): the repository is read again every
``--repository-poll-secs`` seconds, and the server follows what changed. A model directory
added is loaded; one removed is unloaded; one whose files changed (a file added, removed,
or of another size or time, as Triton compares modification times) is loaded again, its
old versions serving until the new ones are ready, and after a reload that fails.

A model whose load failed is tried again only once its files change, as in Triton. A name
that comes to be held by two repositories is unloaded, as Triton unloads it, and its load
then fails with Triton's reason. Reading the repository is file-system work, done off the
event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from batchserve.core.errors import BatchserveError
from batchserve.models.model_directory import FileStamp, directory_stamp
from batchserve.models.repository import DUPLICATE_MODEL, ModelRepository

logger = logging.getLogger(__name__)

Snapshot = Mapping[str, tuple[FileStamp, ...]]
"""Each model's files, with their sizes and times: one stamp per repository holding it."""


def snapshot(repository: ModelRepository) -> Snapshot:
    """The repositories as they are now."""
    return {
        name: tuple(directory_stamp(directory) for directory in repository.directories(name))
        for name in repository.names()
    }


def changes(before: Snapshot, after: Snapshot) -> tuple[list[str], list[str]]:
    """The models to load (added or changed) and to unload (removed, or now held by two
    repositories and so served from neither), by name."""
    loads = sorted(name for name, stamp in after.items() if before.get(name) != stamp)
    unloads = sorted(
        name for name in before if name not in after or (name in loads and len(after[name]) > 1)
    )
    return loads, unloads


class RepositoryPoller:
    """Follows the repository's changes with the registry's own load and unload."""

    def __init__(
        self,
        repository: ModelRepository,
        load: Callable[[str], Awaitable[None]],
        unload: Callable[[str], Awaitable[None]],
        interval_s: float,
    ) -> None:
        self._repository = repository
        self._load, self._unload = load, unload
        self._interval_s = interval_s
        self._seen: Snapshot = {}

    async def start(self) -> None:
        """Remember the repository as the start-up loads find it."""
        self._seen = await asyncio.to_thread(snapshot, self._repository)

    async def run(self) -> None:
        """Poll until cancelled; one poll's failure is logged, and the next poll comes."""
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.poll()
            except OSError as exc:  # the repository itself unreadable: try again next time
                logger.warning("repository poll failed", extra={"error": str(exc)})

    async def poll(self) -> None:
        """Read the repository once and apply what changed since the last read."""
        after = await asyncio.to_thread(snapshot, self._repository)
        loads, unloads = changes(self._seen, after)
        self._seen = after
        for name in unloads:
            where = "removed from the repository" if name not in after else DUPLICATE_MODEL
            logger.info("model unloading", extra={"model": name, "reason": where})
            await self._unload(name)
        for name in loads:
            logger.info("model added or changed in the repository: loading",
                        extra={"model": name})  # fmt: skip
            try:
                await self._load(name)
            except BatchserveError as exc:  # the index and the log say why; the next
                # change to its files tries again
                logger.error("model failed to load",
                             extra={"model": name, "reason": exc.message})  # fmt: skip
