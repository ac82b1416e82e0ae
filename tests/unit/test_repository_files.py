"""Files a repository names are read only when regular and bounded, never blocking."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from batchserve.core.repository_files import UnusableFile, read_regular_file


def test_a_regular_file_within_the_limit_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abcd")
    assert read_regular_file(tmp_path / "f", 4, "a test file") == b"abcd"


def test_a_file_over_the_limit_is_refused_naming_the_limit(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abcde")
    with pytest.raises(
        UnusableFile, match=r"^is larger than 4 bytes \(the limit on a test file\)$"
    ):
        read_regular_file(tmp_path / "f", 4, "a test file")


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_anything_but_a_regular_file_is_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "f"
    if kind == "fifo":
        os.mkfifo(path)  # opening it for reading would wait for a writer
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")  # a device that never ends
    with pytest.raises(UnusableFile) as caught:
        read_regular_file(path, 1 << 20, "a test file")
    assert str(caught.value) == "is not a regular file"


def test_a_missing_file_says_why(tmp_path: Path) -> None:
    with pytest.raises(UnusableFile) as caught:
        read_regular_file(tmp_path / "none", 10, "a test file")
    assert str(caught.value) == "cannot be read: No such file or directory"
