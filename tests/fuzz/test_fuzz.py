"""The long fuzz run (`make fuzz`): every target at FUZZ_EXAMPLES examples (20000 unless set).

Kept out of tests/unit so the normal suite does not run it; the unit suite runs the same
targets at a low count (tests/unit/test_fuzz_targets.py).
"""

from __future__ import annotations

import time

import pytest

from tests.fuzz.targets import TARGETS, Target


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_fuzz(target: Target, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    inputs = target.run("fuzz")
    with capsys.disabled():
        print(f" {inputs} inputs in {time.monotonic() - started:.0f} s", end=" ")
