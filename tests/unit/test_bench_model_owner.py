"""bench.model_owner: a real model-owning process fed by a real feeder process."""

from __future__ import annotations

from pathlib import Path

import uvloop

from bench import model_owner
from bench.model_owner import Ceiling, render
from bench.repo import write_identity


def test_a_short_run_counts_requests_groups_and_cpu(tmp_path: Path) -> None:
    write_identity(tmp_path)
    ceiling = uvloop.run(model_owner.measure(tmp_path, "identity", 1, 8, spread_us=0, seconds=0.5))
    assert ceiling.throughput > 100  # requests went round trip through the arenas
    assert 1 <= ceiling.per_handoff <= 8  # never more than the feeder keeps in flight
    assert 0 < ceiling.compute_us < ceiling.owner_us  # the model's run is part of the CPU


def test_the_results_table_has_a_row_per_point() -> None:
    rows = [Ceiling("identity", 1, 64, 0, 17000.0, 17.0, 3.1, 64.0),
            Ceiling("digits_cnn", 1, 8, 2000, 2253.0, 169.9, 58.5, 3.0)]  # fmt: skip
    text = render(rows, 5.0)
    assert "| identity | 1 | 64 | 0 | 17,000 | 17.0 | 3.1 | 64.0 |" in text
    assert "| digits_cnn | 1 | 8 | 2000 | 2,253 | 169.9 | 58.5 | 3.0 |" in text
