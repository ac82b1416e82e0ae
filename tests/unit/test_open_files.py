"""The soft open-files limit raised to the hard one, at most to ``MOST``: run in a process
started under ``prlimit`` (the limits are the process's own)."""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(shutil.which("prlimit") is None, reason="util-linux's prlimit")

HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
SCRIPT = """
import resource, sys
from batchserve.runtime import open_files
open_files.MOST = int(sys.argv[1])
open_files.raise_to_hard_limit()
print(*resource.getrlimit(resource.RLIMIT_NOFILE), open_files.soft_limit())
"""


def _limits_after_raising(soft: int, most: int) -> list[int]:
    done = subprocess.run(
        ["prlimit", f"--nofile={soft}:", sys.executable, "-c", SCRIPT, str(most)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [int(word) for word in done.stdout.split()]


@pytest.mark.skipif(HARD < 1024, reason="the hard limit leaves no room above the soft one")
def test_the_soft_limit_rises_to_the_hard_one_and_no_further_than_most() -> None:
    assert _limits_after_raising(256, 1 << 30) == [HARD, HARD, HARD]
    assert _limits_after_raising(256, 512) == [512, HARD, 512]
    assert _limits_after_raising(768, 512) == [768, HARD, 768]  # never lowered
