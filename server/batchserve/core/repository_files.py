"""Reading a file the model repository names, refused unless it is a regular file of bounded size.

A repository is written by people and tools the server does not control. A FIFO opened for
reading blocks the load (and the shutdown that waits for it) forever; a device such as
``/dev/zero`` never ends; a huge file held in memory, or parsed holding the GIL, stalls
serving. Every file read whole at load time goes through here, and every path whose
symlinks are followed to see where it leads (``follow_links``): a link to itself used to
raise out of the load and stop the server at start-up.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnusableFile(Exception):
    """Why the file cannot be used; the caller puts the file's name in front."""


def read_regular_file(path: Path, limit: int, what: str) -> bytes:
    """The whole of ``path``: a regular file (after symlinks) of at most ``limit`` bytes."""
    try:
        # O_NONBLOCK: opening a FIFO that no one writes returns at once (then is refused).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UnusableFile(f"cannot be read: {exc.strerror or exc}") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise UnusableFile("is not a regular file")
        too_large = f"is larger than {limit} bytes (the limit on {what})"
        if status.st_size > limit:
            raise UnusableFile(too_large)
        with os.fdopen(fd, "rb", closefd=False) as file:
            data = file.read(limit + 1)  # the file may have grown since fstat
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnusableFile(too_large)
    return data


def follow_links(path: Path) -> Path:
    """``path`` with every symlink followed; UnusableFile where they loop (a link to itself,
    or two to each other), which ``Path.resolve`` raises as RuntimeError before Python 3.13
    and as OSError since."""
    try:
        return path.resolve()
    except RuntimeError:
        raise UnusableFile("is a symlink loop") from None
    except OSError as exc:
        raise UnusableFile(f"cannot be followed: {exc.strerror or exc}") from None
