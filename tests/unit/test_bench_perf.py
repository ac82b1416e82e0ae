"""perf_analyzer's command line and CSV, as the benchmark drives it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import perf
from bench.perf import CHANNEL_SHARE, LOOSE_STABILITY, UNSTABLE, PaSettings, command, parse_csv
from bench.records import PaRow

HEADER = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
    "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
    "p50 latency,p90 latency,p95 latency,p99 latency"
)


def test_parse_csv_takes_the_last_row_in_microseconds() -> None:
    text = f"{HEADER}\n1,100.5,1,2,3,4,5,6,7,800,900,950,990\n4,599.388,9,5773,517,18,319,17,3,6469,9007,9839,12544\n"  # noqa: E501
    row = parse_csv(text)
    assert (row.throughput, row.p50_us, row.p99_us) == (599.388, 6469.0, 12544.0)
    assert (row.queue_us, row.compute_us, row.stable) == (517.0, 319.0, True)


def test_parse_csv_without_server_columns_reads_zero() -> None:
    text = "Concurrency,Inferences/Second,p50 latency,p99 latency\n32,13000,2300,4000\n"
    row = parse_csv(text, stable=False)
    assert (row.queue_us, row.compute_us, row.stable) == (0.0, 0.0, False)


def test_parse_csv_without_rows_is_an_error() -> None:
    with pytest.raises(ValueError, match="without rows"):
        parse_csv(HEADER + "\n")


def test_command_uses_the_peers_flags(tmp_path: Path) -> None:
    out = tmp_path / "o.csv"
    argv = command("m", "grpc", "127.0.0.1:1", 16, PaSettings(6000), out, "perf_analyzer")
    text = " ".join(argv[1:])
    assert "-m m -u 127.0.0.1:1 -i grpc -b 1 --concurrency-range 16:16" in text
    assert "--measurement-interval 6000 --stability-percentage 25 --max-trials 8" in text
    assert argv[-2:] == ["-f", str(tmp_path / "o.csv")]


def test_timeout_covers_every_trial() -> None:
    settings = PaSettings(6000)
    assert settings.timeout_s > settings.max_trials * settings.window_ms / 1000


def test_a_connection_per_client_is_asked_of_perf_analyzer_through_its_environment() -> None:
    assert PaSettings(1000).environment() is None
    environment = PaSettings(1000, grpc_connection_per_client=True).environment()
    assert environment is not None
    assert environment[CHANNEL_SHARE] == "1"
    assert environment["PATH"] == os.environ["PATH"]


def test_the_loose_retry_keeps_the_connections_asked_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tried: list[PaSettings] = []

    def attempt(*args: object) -> tuple[PaRow | None, str]:
        settings = args[4]
        assert isinstance(settings, PaSettings)
        tried.append(settings)
        if len(tried) == 1:
            return None, UNSTABLE
        return PaRow(10.0, 1.0, 2.0, 0.0, 0.0), ""

    monkeypatch.setattr(perf, "_attempt", attempt)
    settings = PaSettings(1000, grpc_connection_per_client=True)
    row, _ = perf.run("m", "grpc", "127.0.0.1:1", 8, settings, tmp_path)
    assert row is not None
    assert not row.stable
    assert [s.stability for s in tried] == [25, LOOSE_STABILITY]
    assert all(s.grpc_connection_per_client for s in tried)
