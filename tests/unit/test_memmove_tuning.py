"""When ``serve`` turns glibc's REP MOVSB off, and how it leaves an operator's tunables."""

from __future__ import annotations

from pathlib import Path

import pytest
from batchserve.runtime.memmove_tuning import (
    AMD,
    REP_MOVSB_THRESHOLD,
    SETTING,
    TUNABLES,
    cpu_vendor,
    tuned_environment,
)

GLIBC_AMD = {"libc": "glibc", "machine": "x86_64", "vendor": AMD}


def test_amd_with_glibc_gets_the_setting_and_keeps_the_rest_of_the_environment() -> None:
    environ = tuned_environment({"PATH": "/bin"}, **GLIBC_AMD)
    assert environ == {"PATH": "/bin", TUNABLES: SETTING}


def test_other_tunables_are_kept_before_the_setting() -> None:
    other = "glibc.malloc.arena_max=2"
    environ = tuned_environment({TUNABLES: other}, **GLIBC_AMD)
    assert environ is not None
    assert environ[TUNABLES] == f"{other}:{SETTING}"


@pytest.mark.parametrize(
    "tunables",
    [
        SETTING,  # the exec already happened: no second one
        f"{REP_MOVSB_THRESHOLD}=2112",  # the operator keeps glibc's default
        f"glibc.malloc.arena_max=2:{REP_MOVSB_THRESHOLD}=8192",
    ],
)
def test_a_tunable_already_set_wins(tunables: str) -> None:
    assert tuned_environment({TUNABLES: tunables}, **GLIBC_AMD) is None


@pytest.mark.parametrize(
    ("libc", "machine", "vendor"),
    [
        ("glibc", "x86_64", "GenuineIntel"),
        ("glibc", "aarch64", ""),
        ("", "x86_64", AMD),  # musl and others: no glibc tunables
    ],
)
def test_left_alone_off_amd_x86_glibc(libc: str, machine: str, vendor: str) -> None:
    assert tuned_environment({}, libc=libc, machine=machine, vendor=vendor) is None


def test_vendor_read_from_the_first_processor(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n\n"
        "processor\t: 1\nvendor_id\t: GenuineIntel\n"
    )
    assert cpu_vendor(cpuinfo) == AMD
    assert cpu_vendor(tmp_path / "missing") == ""
