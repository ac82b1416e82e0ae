"""The server's registered shared-memory regions, system and CUDA, under one namespace.

Names and errors follow Triton's ``shared_memory_manager.cc``: one map for both kinds, so a
name is registered once whatever its kind; unregistering a name that is not registered
(or is of the other kind) succeeds and does nothing; every access checks ``offset`` and
``byte_size`` against the registered region.

A request holds the regions it names from its decoding until it is gone (``hold``): it reads
its input regions while it is decoded and writes its output regions when its outputs are
ready. Unregistering a region a request holds is deferred, as Triton's manager defers it
(``awaiting_unregister_``): the call succeeds, the region stays listed and usable, and it is
unmapped when the last request holding it ends. So a client that unregisters its regions
while its request runs (Triton's L0_shared_memory does) still gets its outputs written.
Calls run on the event loop thread; a hold's release may come from whichever thread drops
the request, so the bookkeeping takes a lock.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from batchserve.core.errors import AlreadyExists, Internal, InvalidArgument, NotFound
from batchserve.core.tensors import UINT64_MAX
from batchserve.dataplane.shared_memory.cuda import CudaRegion
from batchserve.dataplane.shared_memory.system import SystemRegion

Kind = Literal["system", "cuda"]
MAX_REGIONS: Final = 256  # each system region holds a descriptor open
MAX_NAME_LENGTH: Final = 1024


class Region(Protocol):
    name: str
    byte_size: int

    def read(self, offset: int, size: int, tensor: str) -> bytes: ...

    def write(self, offset: int, data: bytes | memoryview, tensor: str) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """One row of a status answer; ``key``/``offset`` for system, ``device_id`` for CUDA."""

    name: str
    byte_size: int
    key: str = ""
    offset: int = 0
    device_id: int = 0


def _kind(region: Region) -> Kind:
    return "cuda" if isinstance(region, CudaRegion) else "system"


def _label(kind: Kind) -> str:
    return "CUDA" if kind == "cuda" else "system"


class SharedMemoryManager:
    """Register, unregister, report, and read and write within registered regions."""

    def __init__(self, max_regions: int = MAX_REGIONS) -> None:
        self._regions: dict[str, Region] = {}
        self._max = max_regions
        self._holds: Counter[str] = Counter()
        """Requests in flight that name each region."""
        self._awaiting: set[str] = set()
        """Regions unregistered while held: unmapped when their last hold is released."""
        self._lock = threading.Lock()

    def hold(self, names: Iterable[str]) -> None:
        """A request in flight uses these (registered) regions until ``release``."""
        with self._lock:
            self._holds.update(names)

    def release(self, names: Iterable[str]) -> None:
        """The request that held these regions has ended: unmap those unregistered since."""
        with self._lock:
            for name in names:
                self._holds[name] -= 1
                if self._holds[name] > 0:
                    continue
                del self._holds[name]
                if name in self._awaiting:
                    self._awaiting.discard(name)
                    region = self._regions.pop(name, None)
                    if region is not None:
                        with contextlib.suppress(Exception):  # Triton logs and goes on
                            region.close()

    def _check_new(self, name: str, kind: Kind) -> None:
        if not name:
            raise InvalidArgument(
                f"'region name' is necessary to register {_label(kind).lower()} shared "
                "memory region"
            )
        if len(name) > MAX_NAME_LENGTH:
            raise InvalidArgument(
                f"shared memory region name is {len(name)} characters (at most {MAX_NAME_LENGTH})"
            )
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        if len(self._regions) >= self._max:
            raise InvalidArgument(
                f"failed to register shared memory region '{name}': {self._max} regions "
                "are registered already (the server's limit); unregister some first"
            )

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_new(name, "system")
        self._regions[name] = SystemRegion(name, key, offset, byte_size)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._check_new(name, "cuda")
        self._regions[name] = CudaRegion(name, raw_handle, device_id, byte_size)

    def unregister(self, kind: Kind, name: str = "") -> None:
        """One region of ``kind`` (nothing when unknown), or every one when ``name`` is empty."""
        names = [name] if name else list(self._regions)
        failed = []
        for each in names:
            with self._lock:
                region = self._regions.get(each)
                if region is None or _kind(region) != kind:
                    continue
                if self._holds[each] > 0:  # in use: unmapped when its last request ends
                    self._awaiting.add(each)
                    continue
                del self._regions[each]
            try:
                region.close()
            except Exception:
                failed.append(each)
        if failed:
            raise Internal(
                f"Failed to unregister the following {_label(kind).lower()} shared memory "
                f"regions: {', '.join(failed)}"
            )

    def status(self, kind: Kind, name: str = "") -> list[RegionStatus]:
        if not name:  # by name, as Triton's std::map lists them
            return [_status(r) for _, r in sorted(self._regions.items()) if _kind(r) == kind]
        region = self._regions.get(name)
        if region is None:
            where = "cuda" if kind == "cuda" else "system"
            raise NotFound(f"Unable to find {where} shared memory region: '{name}'")
        if _kind(region) != kind:
            other = _label(_kind(region))
            raise NotFound(
                f"The region named '{name}' is registered as {other} shared memory, "
                f"not {_label(kind)} shared memory"
            )
        return [_status(region)]

    def region(self, name: str, offset: int, byte_size: int) -> Region:
        """The region ``name``, after checking ``[offset, offset + byte_size)`` lies in it."""
        region = self._regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        if offset >= region.byte_size:
            raise InvalidArgument(
                f"Invalid offset for shared memory region: '{name}' (offset {offset}, the "
                f"region has {region.byte_size} bytes)"
            )
        if byte_size > UINT64_MAX - offset:  # where Triton's size_t sum would wrap
            raise InvalidArgument(
                f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) "
                f"exceeds maximum value ({UINT64_MAX}) for region '{name}'"
            )
        if offset + byte_size > region.byte_size:
            raise InvalidArgument(
                f"Invalid offset + byte size for shared memory region: '{name}' (offset "
                f"{offset} + byte_size {byte_size} is past its {region.byte_size} bytes)"
            )
        return region

    def __len__(self) -> int:
        return len(self._regions)

    def close(self) -> None:
        """Release every region (server shutdown), held or not."""
        with self._lock:
            self._holds.clear()
            self._awaiting.clear()
        kinds: tuple[Kind, ...] = ("system", "cuda")
        for kind in kinds:
            with contextlib.suppress(Internal):
                self.unregister(kind)


def _status(region: Region) -> RegionStatus:
    if isinstance(region, SystemRegion):
        return RegionStatus(region.name, region.byte_size, region.key, region.offset)
    if isinstance(region, CudaRegion):
        return RegionStatus(region.name, region.byte_size, device_id=region.device_id)
    raise AssertionError(f"unknown region type {type(region).__name__}")
