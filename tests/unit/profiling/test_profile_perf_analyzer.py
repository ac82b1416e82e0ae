"""perf_analyzer's command line, its CSV, and the retry of an unstable point.

The CSV below is what perf_analyzer 2.50 wrote against batchserve; the fake binary used for
the retry answers with the real binary's own failure message, checked to be in it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from batchserve.profiling import perf_analyzer
from batchserve.profiling.errors import ProfileError
from batchserve.profiling.perf_analyzer import QUICK_WINDOW, Target, Window

REAL_CSV = """\
Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,\
Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,\
p90 latency,p95 latency,p99 latency
16,8145.08,38,1448,317,9,140,8,0,1595,3164,3564,7312
"""
REAL_BINARY = Path(sys.executable).parent.parent / "lib" / "perf_analyzer" / "perf_analyzer"

FAKE = """\
#!{python}
import sys
args = sys.argv[1:]
stability = int(args[args.index("--stability-percentage") + 1])
once = {fail_once!r}
first = once and not __import__("os").path.exists(once)
if first:
    open(once, "w").close()
if {fail_always} or stability < 100 or first:
    print("{unstable} within 3 measurement windows for concurrency 8.")
    sys.exit(2)
open(args[args.index("-f") + 1], "w").write({csv!r})
"""


def fake_binary(tmp_path: Path, *, fail_always: bool = False, fail_once: bool = False) -> Path:
    path = tmp_path / "perf_analyzer"
    path.write_text(
        FAKE.format(
            python=sys.executable,
            fail_always=fail_always,
            fail_once=str(tmp_path / "failed-once") if fail_once else "",
            unstable=perf_analyzer.UNSTABLE,
            csv=REAL_CSV,
        )
    )
    path.chmod(0o755)
    return path


def test_the_csv_row_turns_into_throughput_and_milliseconds() -> None:
    measured = perf_analyzer.parse_csv(REAL_CSV)
    assert measured.concurrency == 16
    assert measured.throughput == 8145.08
    assert (measured.p50_ms, measured.p95_ms, measured.p99_ms) == (1.595, 3.564, 7.312)
    assert measured.stable


def test_the_last_row_counts_and_a_csv_without_one_is_an_error() -> None:
    two_rows = REAL_CSV + "32,9000,1,1,1,1,1,1,0,2000,2500,3000,4000\n"
    assert perf_analyzer.parse_csv(two_rows).concurrency == 32
    with pytest.raises(ProfileError, match="without rows"):
        perf_analyzer.parse_csv(REAL_CSV.splitlines()[0])
    with pytest.raises(ProfileError, match="lacks a usable column"):
        perf_analyzer.parse_csv("Concurrency,Inferences/Second\n1,2\n")


def test_the_command_line_measures_batch_1_requests_at_one_concurrency(tmp_path: Path) -> None:
    target = Target(Path("/pa"), "digits_cnn", "grpc", "127.0.0.1:9", ("--shape", "x:3"))
    argv = perf_analyzer.command(target, 24, Window(700, 30, 5), tmp_path / "out.csv")
    assert argv == [
        "/pa", "-m", "digits_cnn", "-u", "127.0.0.1:9", "-i", "grpc", "-b", "1",
        "--concurrency-range", "24:24", "--measurement-interval", "700",
        "--stability-percentage", "30", "--max-trials", "5", "-f", str(tmp_path / "out.csv"),
        "--shape", "x:3",
    ]  # fmt: skip


@pytest.mark.skipif(not REAL_BINARY.is_file(), reason="perf_analyzer is not installed")
def test_the_unstable_message_is_the_real_binarys() -> None:
    assert perf_analyzer.UNSTABLE.encode() in REAL_BINARY.read_bytes()


def test_an_unstable_point_is_measured_again_loosely_and_marked(tmp_path: Path) -> None:
    target = Target(fake_binary(tmp_path), "m", "http", "127.0.0.1:9")
    measured = perf_analyzer.measure(target, 16, Window(100, 20, 3))
    assert measured.throughput == 8145.08
    assert not measured.stable


def test_a_busy_moment_that_upsets_even_quick_windows_is_measured_once_more(
    tmp_path: Path,
) -> None:
    target = Target(fake_binary(tmp_path, fail_once=True), "m", "http", "127.0.0.1:9")
    measured = perf_analyzer.measure(target, 16, QUICK_WINDOW)
    assert measured.throughput == 8145.08
    assert not measured.stable


def test_a_failure_quotes_perf_analyzers_last_words(tmp_path: Path) -> None:
    target = Target(fake_binary(tmp_path, fail_always=True), "m", "http", "127.0.0.1:9")
    with pytest.raises(ProfileError, match=r"status 2: Failed to obtain stable measurement"):
        perf_analyzer.measure(target, 16, QUICK_WINDOW)


def test_find_takes_the_given_binary_or_says_what_to_do(tmp_path: Path) -> None:
    binary = fake_binary(tmp_path)
    assert perf_analyzer.find(binary) == binary
    not_executable = tmp_path / "plain"
    not_executable.write_text("")
    with pytest.raises(ProfileError, match="not an executable file"):
        perf_analyzer.find(not_executable)


def test_find_looks_beside_this_python_then_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beside = tmp_path / "venv" / "bin"
    beside.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(beside / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ProfileError, match="--perf-analyzer PATH"):
        perf_analyzer.find(None)
    on_path = fake_binary(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert perf_analyzer.find(None) == on_path
    (beside / "perf_analyzer").write_bytes(on_path.read_bytes())
    (beside / "perf_analyzer").chmod(0o755)
    assert perf_analyzer.find(None) == beside / "perf_analyzer"
