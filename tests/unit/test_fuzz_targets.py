"""The fuzz targets of `make fuzz` at a low example count, so that they stay green in CI."""

from __future__ import annotations

import pytest

from tests.fuzz.targets import TARGETS, Target


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_fuzz_target_at_a_low_count(target: Target) -> None:
    target.run("fuzz-smoke")
