import sys
from pathlib import Path

import pytest

# The benchmark's helpers (package `bench` at the repository root) have unit tests here too;
# `python -m pytest` finds them from the root, a bare `pytest` needs the root on the path.
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.append(ROOT)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
