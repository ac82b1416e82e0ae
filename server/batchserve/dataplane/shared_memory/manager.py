"""The server's registered shared-memory regions, system and CUDA, under one namespace.

Names and errors follow Triton's ``shared_memory_manager.cc``: one map for both kinds, so a
name is registered once whatever its kind; unregistering a name that is not registered
(or is of the other kind) succeeds and does nothing; every access checks ``offset`` and
``byte_size`` against the registered region.

All calls run on the event loop thread, one at a time, and each access is a synchronous
copy: a region is never unregistered in the middle of one. A request reads its input
regions while it is decoded and writes its output regions when its outputs are ready,
looking each one up again then: unregistering a region between the two fails that request
with a clear error (Triton instead defers the unregistration until the request ends).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from batchserve.core.errors import AlreadyExists, Internal, InvalidArgument, NotFound
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
            region = self._regions.get(each)
            if region is None or _kind(region) != kind:
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
        if offset + byte_size > region.byte_size:
            raise InvalidArgument(
                f"Invalid offset + byte size for shared memory region: '{name}' (offset "
                f"{offset} + byte_size {byte_size} is past its {region.byte_size} bytes)"
            )
        return region

    def __len__(self) -> int:
        return len(self._regions)

    def close(self) -> None:
        """Release every region (server shutdown)."""
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
