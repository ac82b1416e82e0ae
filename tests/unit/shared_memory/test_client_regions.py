"""Registering, unregistering and listing regions, each only for a client
``--allow-client-shm`` admits; status answers the others an empty list, as Triton."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from batchserve.core.errors import PermissionDenied
from batchserve.core.settings import ClientShm
from batchserve.dataplane.shared_memory.clients import ClientRegions
from batchserve.dataplane.shared_memory.manager import SharedMemoryManager
from batchserve.dataplane.shared_memory.system import SHM_DIR

REMOTE = "ipv4:10.1.2.3:5000"


@pytest.fixture
def manager() -> Iterator[SharedMemoryManager]:
    regions = SharedMemoryManager()
    yield regions
    regions.close()


@pytest.fixture
def key() -> Iterator[str]:
    """A 16-byte object made as a client makes it (a file under SHM_DIR); its key."""
    name = f"bstest_{uuid.uuid4().hex[:12]}"
    path = os.path.join(SHM_DIR, name)
    with open(path, "xb") as made:
        made.write(bytes(16))
    yield "/" + name
    os.unlink(path)


def test_a_local_client_registers_lists_and_unregisters(
    manager: SharedMemoryManager, key: str
) -> None:
    regions = ClientRegions(ClientShm.LOCAL, manager)
    regions.register_system("r", key, 0, 16, "127.0.0.1")
    assert [row.name for row in regions.status("system", "", "ipv6:[::1]:5000")] == ["r"]
    regions.unregister("system", "r", "127.0.0.1")
    assert len(manager) == 0


def test_a_remote_client_is_refused_and_shown_nothing(
    manager: SharedMemoryManager, key: str
) -> None:
    manager.register_system("r", key, 0, 16)
    regions = ClientRegions(ClientShm.LOCAL, manager)
    expected = (
        r"^Client shared memory is disabled\. Start the server with '--allow-client-shm=true' "
        r"to enable\.; batchserve admits only clients on this host \(--allow-client-shm=local\), "
        f"and this one is {REMOTE}$"
    )
    with pytest.raises(PermissionDenied, match=expected):
        regions.register_system("s", key, 0, 16, REMOTE)
    with pytest.raises(PermissionDenied, match=expected):
        regions.unregister("system", "r", REMOTE)
    with pytest.raises(PermissionDenied, match=r"and this one is unknown$"):
        regions.check(None)
    assert regions.status("system", "", REMOTE) == []
    assert len(manager) == 1  # nothing registered, nothing removed


def test_off_refuses_every_client_and_true_admits_every_one(manager: SharedMemoryManager) -> None:
    off = ClientRegions(ClientShm.FALSE, manager)
    with pytest.raises(PermissionDenied, match=r"to enable\.$"):
        off.check("127.0.0.1")
    ClientRegions(ClientShm.TRUE, manager).check(REMOTE)
