"""The order in which a run takes a model's points: paired rounds where its target is judged.

perf_analyzer, the echo servers and the in-process session are replaced by recorders here:
what is under test is which point is taken next, not the figures (the integration tests run
perf_analyzer for real).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from batchserve.core.datatypes import BY_WIRE

from bench import ceiling, repo, run, servers
from bench.inputs import ModelInputs, Sample
from bench.records import (
    AIOHTTP,
    BATCHSERVE,
    GRPC_AIO,
    IDENTITY,
    PYTRITON,
    CeilingPoint,
    PaRow,
    Results,
    ServerPoint,
)


def served(label: str, **ports: int) -> servers.Running:
    """A server that was never started: its points come from the recorder."""
    return servers.Running(label, cast(Any, None), ports)


def subject(name: str, tmp_path: Path) -> run.Subject:
    sample = Sample("x", BY_WIRE["FP32"], np.zeros(4, dtype=np.float32), free_axes=False)
    return run.Subject(name, tmp_path / name, None, ModelInputs(name, True, (sample,)))


def runner(tmp_path: Path, rate_of_ceiling: float, monkeypatch: pytest.MonkeyPatch) -> tuple[
    run.Runner, list[str]
]:  # fmt: skip
    """A full-run plan at c=1, 16 and 32, whose model's best ceiling is ``rate_of_ceiling``
    against an aiohttp floor of 10,000/s; returns the runner and the log of what it took."""
    plan = run.Plan(False, (1, 16, 32), (1, 16), 0.1, 1000, 0.0, 3)
    results = Results(shipped={"m": "on"})
    results.ceilings.append(CeilingPoint("m", 16, 16 / rate_of_ceiling, 5))
    row = PaRow(10000.0, 1.0, 2.0, 0.0, 0.0)
    results.points.append(ServerPoint(AIOHTTP, IDENTITY, "http", 32, "", row))
    taken: list[str] = []

    def measure(running: Any, model: str, protocol: str, c: int, *rest: Any) -> ServerPoint:
        taken.append(f"{running.label} {protocol} c={c}")
        return ServerPoint(running.label, model, protocol, c, rest[0], row)

    @contextmanager
    def floor(module: str, label: str, protocol: str) -> Iterator[Any]:
        yield served(label, **{protocol: 1})

    def in_process(model_file: Path, inputs: ModelInputs, batches: Any, *_: Any, **__: Any) -> Any:
        taken.append(f"ceiling b={batches[0]}")
        return [CeilingPoint(inputs.model, batches[0], 0.1, 5)]

    monkeypatch.setattr(servers, "measure", measure)
    monkeypatch.setattr(servers, "floor", floor)
    monkeypatch.setattr(ceiling, "measure", in_process)
    monkeypatch.setattr(repo, "onnx_file", lambda directory: directory / "model.onnx")
    return run.Runner(plan, tmp_path, results), taken


def test_a_request_bound_model_alternates_with_the_echo_floors_at_c32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench, taken = runner(tmp_path, 1_000_000.0, monkeypatch)
    model, identity = subject("m", tmp_path), subject(IDENTITY, tmp_path)
    bench.points(served(BATCHSERVE, grpc=2), model, "on", ("grpc",), identity)
    rounds = [f"{GRPC_AIO} grpc c=32", f"{BATCHSERVE} grpc c=32"] * 3
    alone = [f"{BATCHSERVE} grpc c=1"] * 3
    assert taken == [*alone, f"{BATCHSERVE} grpc c=16", *rounds]
    points = [p for p in bench.results.points if p.concurrency == 32 and p.server != AIOHTTP]
    assert [(p.server, p.round, p.beside) for p in points] == [
        (GRPC_AIO, 0, "m"), (BATCHSERVE, 0, ""), (GRPC_AIO, 1, "m"), (BATCHSERVE, 1, ""),
        (GRPC_AIO, 2, "m"), (BATCHSERVE, 2, ""),
    ]  # fmt: skip


def test_a_compute_bound_model_alternates_with_its_ceiling_at_c16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench, taken = runner(tmp_path, 40.0, monkeypatch)  # 0.95 x 40 < 0.6 x 10,000
    model, identity = subject("m", tmp_path), subject(IDENTITY, tmp_path)
    bench.points(served(BATCHSERVE, grpc=2), model, "on", ("grpc",), identity)
    rounds = ["ceiling b=16", f"{BATCHSERVE} grpc c=16"] * 3
    once = [f"{GRPC_AIO} grpc c=32", f"{BATCHSERVE} grpc c=32"]
    assert taken == [*[f"{BATCHSERVE} grpc c=1"] * 3, *rounds, *once]
    beside = [(c.beside, c.round) for c in bench.results.ceilings if c.beside]
    assert beside == [("m", 0), ("m", 1), ("m", 2)]


def test_a_variant_without_floors_is_taken_once_per_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench, taken = runner(tmp_path, 1_000_000.0, monkeypatch)
    bench.points(served(BATCHSERVE, http=1), subject("m", tmp_path), "off", ("http",))
    assert taken == [f"{BATCHSERVE} http c={c}" for c in (1, 16, 32)]


def test_the_shipped_c1_point_is_taken_in_rounds_even_without_floors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The identity model through batchserve has no floors of its own but a c=1 target."""
    bench, taken = runner(tmp_path, 1_000_000.0, monkeypatch)
    bench.results.shipped[IDENTITY] = "on"
    bench.points(served(BATCHSERVE, http=1), subject(IDENTITY, tmp_path), "on", ("http",))
    assert taken == [
        *[f"{BATCHSERVE} http c=1"] * 3,
        f"{BATCHSERVE} http c=16",
        f"{BATCHSERVE} http c=32",
    ]
    assert [p.round for p in bench.results.points if p.concurrency == 1] == [0, 1, 2]


def test_a_peer_takes_each_point_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench, taken = runner(tmp_path, 1_000_000.0, monkeypatch)
    bench.points(served(PYTRITON, http=1), subject("m", tmp_path), "on", ("http",))
    assert taken == [f"{PYTRITON} http c={c}" for c in (1, 16, 32)]
