"""bench/RESULTS.md rendering: tables, ratios, warnings and notes from known figures."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bench.records import (
    AIOHTTP,
    BATCHSERVE,
    GRPC_AIO,
    IDENTITY,
    PYTRITON,
    RAW_ASGI,
    CeilingPoint,
    PaRow,
    Results,
    SectionLoad,
    ServerPoint,
)
from bench.report import ceiling_line, progress_line, ratio, render, table
from bench.targets import evaluate


def point(server: str, model: str, protocol: str, rate: float, stable: bool = True) -> ServerPoint:
    row = PaRow(rate, 2300.0, 4100.0, 120.0, 340.0, stable)
    return ServerPoint(server, model, protocol, 32, "on", row, 3200, 100, 1.6, 3.0, 0.4, 64)


def sample() -> Results:
    found = Results(header=["Machine: test box"], command="python -m bench.run", quick=True)
    found.ceilings = [
        CeilingPoint("small", 1, 0.00004, 2000),
        CeilingPoint("small", 32, 0.0004, 500),
    ]
    found.points = [
        point(AIOHTTP, IDENTITY, "http", 13000),
        point(RAW_ASGI, IDENTITY, "http", 18000),
        point(GRPC_AIO, IDENTITY, "grpc", 5800, stable=False),
        point(BATCHSERVE, "small", "http", 8000),
        ServerPoint(BATCHSERVE, "small", "grpc", 32, "on", None, error="boom\nport closed"),
        ServerPoint(BATCHSERVE, "small", "grpc", 32, "off", None, error="port closed\n"),
    ]
    found.shipped = {"small": "on", IDENTITY: "on"}
    found.sections = [
        SectionLoad("ceiling", 0.3, 0.9, 0.02),
        SectionLoad("floors", 2.5, 3.0, 0.05),
        SectionLoad("batchserve small", 0.5, 2.0, 0.35),
    ]
    return found


def test_table_aligns_numbers_right() -> None:
    text = table(("name", "rate"), [("a", "1"), ("b", "22")], "lr")
    assert text.splitlines() == ["| name | rate |", "| --- | ---: |", "| a | 1 |", "| b | 22 |"]
    with pytest.raises(ValueError, match="one letter per column"):
        table(("name", "rate"), [], "l")


def test_ratio_is_a_dash_without_a_base() -> None:
    assert ratio(8000, 13000) == "0.62"
    assert ratio(8000, None) == ratio(math.nan, 1.0) == ratio(1.0, 0.0) == "—"


def test_render_shows_each_section_with_ratios() -> None:
    found = sample()
    text = render(found, evaluate(found))
    assert "**Quick run**" in text
    assert "| small | 25,000 (0.040 ms) | 80,000 (0.400 ms) | **80,000** (b=32) |" in text
    # 8,000/s is 0.10 of the 80,000 ceiling, 0.62 of aiohttp's 13,000 and 0.44 of raw ASGI.
    assert "| small | HTTP | on | 32 | 8,000 | 2.30 | 4.10 | 0.12 | 0.34 | 32.0 | 64 | 500 | " \
        "0.10 | 0.62 | 0.44 | 0.40 |" in text  # fmt: skip
    assert "| raw ASGI echo | HTTP | 32 | 18,000 | 2.30 | 4.10 | 32.0 | 500 | 1.38 | 0.40 |" in text
    assert (
        "| small HTTP c=32 >= 0.6 x aiohttp echo | 8,000/s = 0.62 x 13,000/s | **PASS** |" in text
    )


def test_render_warns_of_load_instability_and_failures() -> None:
    found = sample()
    text = render(found, evaluate(found))
    assert "| ceiling | 0.30 | 0.90 | 2% |  |" in text
    assert "| floors | 2.50 | 3.00 | 5% | load1 > 1 |" in text
    assert "| 0.50 | 2.00 | 35% | other work used 35% of the CPU |" in text
    assert "The machine was busy before: floors, batchserve small (see the load table)." in text
    assert "| grpc.aio echo | gRPC | 32 | 5,800* |" in text
    assert "taken again at 100 %" in text
    failed = "Failed (batchserve small gRPC c=32 on, batchserve small gRPC c=32 off): port closed"
    assert failed in text
    assert "Peers were not run" in text
    assert "small is judged request-bound: 0.95 x its ceiling = 76,000/s against 0.6 x" in text


def test_render_shows_peers_when_measured() -> None:
    found = sample()
    found.points.append(point(PYTRITON, "small", "http", 2400))
    found.peers_note = "PyTriton 0.7.0 behind the same perf_analyzer."
    text = render(found, evaluate(found))
    assert "| small | HTTP | on | 32 | 2,400 |" in text
    assert "PyTriton 0.7.0 behind the same perf_analyzer." in text
    assert "Peers were not run" not in text


def test_progress_lines() -> None:
    found = sample()
    assert progress_line(found.points[3]).startswith("  batchserve small HTTP c=32 on: 8,000/s")
    assert progress_line(found.points[4]).endswith("FAILED port closed")


def test_floors_beside_a_model_are_labelled_and_used_for_its_ratios() -> None:
    found = sample()
    found.points.append(replace(point(AIOHTTP, IDENTITY, "http", 10000), beside="small"))
    text = render(found, evaluate(found))
    assert "| aiohttp echo, beside small | HTTP | 32 | 10,000 |" in text
    # 8,000/s against the 10,000 beside it (0.80), not the section's 13,000 (0.62)
    assert "| small | HTTP | on | 32 | 8,000 | 2.30 | 4.10 | 0.12 | 0.34 | 32.0 | 64 | 500 | " \
        "0.10 | 0.80 | 0.44 | 0.40 |" in text  # fmt: skip
    assert "8,000/s = 0.80 x 10,000/s" in text


def test_rounds_are_labelled_and_each_uses_its_own_reference() -> None:
    found = sample()
    for number, (echo_rate, ours) in enumerate([(10000, 8000), (16000, 8000)]):
        echo = replace(point(AIOHTTP, IDENTITY, "http", echo_rate), beside="small", round=number)
        found.points += [echo, replace(point(BATCHSERVE, "small", "http", ours), round=number)]
    del found.points[3]  # the unpaired point from sample()
    text = render(found, evaluate(found))
    assert "| aiohttp echo, beside small, round 2 of 2 | HTTP | 32 | 16,000 |" in text
    # each round against its own echo point: 0.80 and 0.50
    assert "| small | HTTP | on | 32, round 1 of 2 | 8,000 |" in text
    assert "| 500 | 0.10 | 0.80 |" in text
    assert "| small | HTTP | on | 32, round 2 of 2 | 8,000 |" in text
    assert "| 500 | 0.10 | 0.50 |" in text


def test_a_ceiling_taken_beside_serves_only_its_own_round() -> None:
    found = sample()
    del found.points[3:]
    found.ceilings += [
        CeilingPoint("small", 32, 0.0005, 40, beside="small", protocol="http", round=0),
        CeilingPoint("small", 32, 0.0001, 40, beside="small", protocol="grpc", round=0),
    ]
    at = {16: 32000.0, 4: 8000.0}
    found.points += [replace(point(BATCHSERVE, "small", "http", at[c]), concurrency=c) for c in at]
    text = render(found, evaluate(found))
    assert "| small | HTTP | 1 | 32 | 64,000 | 40 |" in text
    assert "| small | gRPC | 1 | 32 | 320,000 | 40 |" in text
    # c=16 against the HTTP ceiling taken before it (64,000/s); c=4, taken once, against
    # the ceiling section's best (80,000/s)
    assert "| small | HTTP | on | 16 | 32,000 |" in text
    assert "| 500 | 0.50 | " in text
    assert "| small | HTTP | on | 4 | 8,000 |" in text
    assert "| 500 | 0.10 | " in text
    assert ceiling_line(found.ceilings[-1]).startswith("  small b=32 before gRPC round 1: 320,000")
