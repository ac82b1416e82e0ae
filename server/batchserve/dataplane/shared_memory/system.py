"""A client's POSIX shared-memory object, read and written with ``pread``/``pwrite``.

The client owns the object and may shrink it (``ftruncate``) at any moment. A load from an
``mmap`` page past the object's new end raises SIGBUS and would kill the server, so nothing
here maps the object: every access is a ``pread``/``pwrite`` on a descriptor kept open from
registration, after an ``fstat`` of the object's current size. A read of a shrunk object
comes back short (an error here, never a signal). The one window left: an object shrunk
between the ``fstat`` and a ``pwrite`` is grown back to cover the write (the kernel extends a
file written past its end); the client's own object, never a crash.

The descriptor also keeps the object alive if the client unlinks it, as Triton's mapping
does, and nothing here registers it with ``multiprocessing``'s resource tracker (which
would unlink it at exit).
"""

from __future__ import annotations

import os
import stat
from typing import Final

from batchserve.core.errors import InvalidArgument

SHM_DIR: Final = "/dev/shm"  # where Linux's shm_open(3) keeps POSIX shared-memory objects
MAX_KEY_LENGTH: Final = 255  # NAME_MAX
RESERVED_PREFIX: Final = "triton_python_backend_shm_region_"  # Triton keeps it for itself
_FLAGS: Final = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


def object_name(region: str, key: str) -> str:
    """The file name of ``key`` under SHM_DIR, refused unless it is a plain POSIX shm name.

    shm_open(3) takes ``/name`` (tritonclient sends ``/name``; Python's SharedMemory opens
    ``//name``, the same object): any leading slashes, then one path component.
    """
    name = key.lstrip("/")
    if not name:
        raise InvalidArgument(
            f"cannot register shared memory region '{region}' - invalid shm key '{key}'"
        )
    if name.startswith(RESERVED_PREFIX):
        raise InvalidArgument(
            f"cannot register shared memory region '{region}' with key '{key}' as the key "
            f"contains the reserved prefix '{RESERVED_PREFIX}'"
        )
    if "/" in name or "\0" in name or name in (".", "..") or len(name) > MAX_KEY_LENGTH:
        raise InvalidArgument(
            f"cannot register shared memory region '{region}' - invalid shm key '{key}': "
            f"a key is '/' and one name of at most {MAX_KEY_LENGTH} characters, without "
            "'/' or NUL, not '.' or '..'"
        )
    return name


class SystemRegion:
    """``byte_size`` bytes at ``offset`` of the object ``key``, checked at registration."""

    def __init__(self, name: str, key: str, offset: int, byte_size: int) -> None:
        path = os.path.join(SHM_DIR, object_name(name, key))
        try:
            fd = os.open(path, _FLAGS)
        except OSError:
            raise InvalidArgument(f"Unable to open shared memory region: '{key}'") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidArgument(f"Invalid shared memory region: '{key}'")
            size = info.st_size
            if offset + byte_size > size:
                raise InvalidArgument(
                    f"failed to register shared memory region '{name}': invalid args "
                    f"(offset {offset} + byte_size {byte_size} is past the end of the "
                    f"{size}-byte object '{key}')"
                )
        except BaseException:
            os.close(fd)
            raise
        self.name, self.key, self.offset, self.byte_size = name, key, offset, byte_size
        self._fd = fd

    def _check_size(self, start: int, size: int, tensor: str) -> None:
        """The object still holds ``[start, start + size)`` (the client may have shrunk it)."""
        now = os.fstat(self._fd).st_size
        if start + size > now:
            raise InvalidArgument(
                f"tensor '{tensor}': shared memory region '{self.name}' (key '{self.key}') "
                f"was truncated to {now} bytes; bytes {start}..{start + size} are gone"
            )

    def read(self, offset: int, size: int, tensor: str) -> bytes:
        """A copy of ``size`` bytes at ``offset`` within the region (bounds checked by the
        caller against ``byte_size``)."""
        start = self.offset + offset
        self._check_size(start, size, tensor)
        try:
            data = os.pread(self._fd, size, start)
        except OSError as error:
            raise self._failed("read", tensor, error) from None
        if len(data) != size:
            raise InvalidArgument(
                f"tensor '{tensor}': shared memory region '{self.name}' (key '{self.key}') "
                f"was truncated while it was read ({len(data)} of {size} bytes)"
            )
        return data

    def write(self, offset: int, data: bytes | memoryview, tensor: str) -> None:
        start = self.offset + offset
        view = memoryview(data).cast("B")
        self._check_size(start, view.nbytes, tensor)
        while view.nbytes:
            try:
                written = os.pwrite(self._fd, view, start)
            except OSError as error:
                raise self._failed("written", tensor, error) from None
            view, start = view[written:], start + written

    def _failed(self, verb: str, tensor: str, error: OSError) -> InvalidArgument:
        return InvalidArgument(
            f"tensor '{tensor}': shared memory region '{self.name}' (key '{self.key}') could "
            f"not be {verb}: {error.strerror}"
        )

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
