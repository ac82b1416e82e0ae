"""The host-speed line at the head of every results file."""

from __future__ import annotations

import threading

import pytest

from bench import host_speed, machine
from bench.host_speed import HostSpeed


def test_the_line_gives_both_figures_in_their_units() -> None:
    line = str(HostSpeed(loop_s=0.374, wake_us=67.48))
    assert line.startswith("Host speed: ")
    assert "10-million-step Python loop in 0.37 s" in line
    assert "in 67.5 µs" in line


def test_a_wake_is_timed_as_a_real_round_trip_and_leaves_no_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host_speed, "ROUND_TRIPS", 50)
    before = threading.active_count()
    wake_us = host_speed._wake_us()
    # two system calls and a thread's wake each way cannot take under a microsecond,
    # nor a second on any host this runs on
    assert 1 < wake_us < 1_000_000
    assert threading.active_count() == before


def test_the_loop_is_timed_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_speed, "LOOP_STEPS", 10_000)
    small = host_speed._loop_s()
    monkeypatch.setattr(host_speed, "LOOP_STEPS", 2_000_000)
    assert host_speed._loop_s() > small > 0


def test_every_results_head_carries_the_host_speed_after_the_os(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host_speed, "measure", lambda: HostSpeed(1.25, 4.0))
    lines = machine.describe()
    assert lines[1].startswith("OS: ")
    assert lines[2] == str(HostSpeed(1.25, 4.0))
    assert lines[3].startswith("Python ")
