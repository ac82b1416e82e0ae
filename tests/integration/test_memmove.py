"""A real server on an AMD CPU runs, with its workers, with glibc's REP MOVSB off
(``runtime/memmove_tuning.py``), in the process the caller started; elsewhere, or where the
operator set the tunable, the environment is left as it was."""

from __future__ import annotations

import platform
from pathlib import Path

from tests.integration.server import MODEL_REPO, ServerProcess, start_server

TUNABLES = "GLIBC_TUNABLES"
OFF = "glibc.cpu.x86_rep_movsb_threshold=1099511627776"
KEPT = "glibc.cpu.x86_rep_movsb_threshold=2112"


def amd_glibc() -> bool:
    """Read here, apart from the server's own check."""
    vendor_amd = "vendor_id\t: AuthenticAMD" in Path("/proc/cpuinfo").read_text()
    return vendor_amd and platform.machine() == "x86_64" and platform.libc_ver()[0] == "glibc"


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (item.decode().partition("=") for item in raw if item)
    return {key: value for key, _, value in pairs}


def descendants(pid: int) -> list[int]:
    """Its children, theirs, and so on (the fork server and the workers it forked)."""
    children = [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]
    return [*children, *(grandchild for child in children for grandchild in descendants(child))]


def listening(server: ServerProcess) -> dict[str, object]:
    (record,) = [r for r in server.logs if r.get("message") == "listening"]
    return record


def test_the_started_process_runs_tuned_on_amd(server: ServerProcess) -> None:
    """The pid the caller holds is the server's: the exec replaced the program in place."""
    tunables = environ(server.process.pid).get(TUNABLES, "")
    if amd_glibc():
        assert tunables == OFF
        assert listening(server)["rep_movsb"] == "off"
    else:
        assert OFF not in tunables
        assert listening(server)["rep_movsb"] == "glibc default"


def test_workers_inherit_it() -> None:
    server = start_server(MODEL_REPO, ["--workers", "2"])
    try:
        workers = descendants(server.process.pid)
        assert len(workers) == 3  # the fork server and two workers
        for pid in [server.process.pid, *workers]:
            assert (environ(pid).get(TUNABLES) == OFF) is amd_glibc()
    finally:
        assert server.stop() == 0


def test_the_operators_setting_wins() -> None:
    server = start_server(MODEL_REPO, extra_env={TUNABLES: KEPT})
    try:
        assert environ(server.process.pid)[TUNABLES] == KEPT
        assert listening(server)["rep_movsb"] == "glibc default"
    finally:
        assert server.stop() == 0
