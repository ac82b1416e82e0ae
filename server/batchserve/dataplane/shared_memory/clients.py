"""Which clients may register and name shared-memory regions: a region is the server's host
or GPU memory, so only those ``--allow-client-shm`` admits (by default those on this host).
"""

from __future__ import annotations

from batchserve.core.errors import PermissionDenied
from batchserve.core.settings import ClientShm
from batchserve.dataplane.shared_memory.manager import Kind, RegionStatus, SharedMemoryManager
from batchserve.dataplane.shared_memory.peers import is_local


class ClientRegions:
    """The regions' register, unregister and status calls, each for an admitted client."""

    def __init__(self, mode: ClientShm, manager: SharedMemoryManager) -> None:
        self.mode = mode
        self.manager = manager

    def check(self, peer: str | None) -> None:
        """Refuse a client ``--allow-client-shm`` does not admit; ``peer`` is its address."""
        mode = self.mode
        if mode is ClientShm.TRUE or (mode is ClientShm.LOCAL and is_local(peer)):
            return
        why = (
            f"; batchserve admits only clients on this host (--allow-client-shm=local), "
            f"and this one is {peer or 'unknown'}"
            if mode is ClientShm.LOCAL
            else ""
        )
        raise PermissionDenied(
            "Client shared memory is disabled. Start the server with "
            f"'--allow-client-shm=true' to enable.{why}"
        )

    def register_system(
        self, name: str, key: str, offset: int, byte_size: int, peer: str | None
    ) -> None:
        self.check(peer)
        self.manager.register_system(name, key, offset, byte_size)

    def register_cuda(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int, peer: str | None
    ) -> None:
        self.check(peer)
        self.manager.register_cuda(name, raw_handle, device_id, byte_size)

    def unregister(self, kind: Kind, name: str, peer: str | None) -> None:
        """One region, or every region of ``kind`` when ``name`` is empty."""
        self.check(peer)
        self.manager.unregister(kind, name)

    def status(self, kind: Kind, name: str = "", peer: str | None = None) -> list[RegionStatus]:
        """The regions, to the clients that may register them; to others none (as Triton
        answers when client shared memory is off)."""
        try:
            self.check(peer)
        except PermissionDenied:
            return []
        return self.manager.status(kind, name)
