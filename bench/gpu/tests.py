"""The GPU-marked tests: found, run with ``pytest -m gpu`` and summarised from JUnit XML.

The files under ``tests/`` that mention ``mark.gpu`` are run, one pytest process per test
directory (the unit and integration suites cannot share a process). Collecting all of
``tests/unit`` instead would import the deployment and dashboard tests' packages, which a GPU
machine need not have; every GPU-marked test is in a file that names the marker, and a file
that fails to import is reported as an error, not silently left out.
"""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from bench.common import ROOT
from bench.gpu.records import PytestRun

MARKER = "mark.gpu"
TIMEOUT_S = 900


def groups(paths: Iterable[Path], tests_dir: Path) -> dict[str, list[str]]:
    """Test files by the directory under ``tests/`` they belong to, sorted."""
    found: dict[str, list[str]] = {}
    for path in sorted(paths):
        top = path.relative_to(tests_dir).parts[0]
        found.setdefault(f"tests/{top}", []).append(str(path.relative_to(tests_dir.parent)))
    return found


def marked_files(tests_dir: Path) -> list[Path]:
    return [p for p in tests_dir.rglob("test_*.py") if MARKER in p.read_text(errors="replace")]


def parse_junit(group: str, text: str, seconds: float) -> PytestRun:
    """Counts, failures (with the first line of their message) and skip reasons."""
    root = ET.fromstring(text)
    passed = failed = errors = 0
    failures, skips = [], Counter[str]()
    for case in root.iter("testcase"):
        name = "::".join(part for part in (case.get("classname"), case.get("name")) if part)
        outcome = next((child for child in case if child.tag in _OUTCOMES), None)
        if outcome is None:
            passed += 1
        elif outcome.tag == "skipped":
            skips[_first_line(outcome.get("message", ""))] += 1
        else:
            failed += outcome.tag == "failure"
            errors += outcome.tag == "error"
            failures.append((name, _why(outcome)))
    return PytestRun(
        group, passed, failed, sum(skips.values()), errors, seconds,
        tuple(failures), tuple(sorted(skips.items(), key=lambda item: -item[1])),
    )  # fmt: skip


_OUTCOMES = ("skipped", "failure", "error")


def _why(outcome: ET.Element) -> str:
    """The message's first line, and for a bare "collection failure" the error behind it
    (pytest's last ``E`` line: the ImportError that stopped the file)."""
    message = _first_line(outcome.get("message", ""))
    raised = [line[1:].strip() for line in (outcome.text or "").splitlines() if line[:2] == "E "]
    if raised and (message == "(no message)" or "collection failure" in message):
        return f"{message}: {raised[-1]}"[:300]
    return message


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:200] if lines else "(no message)"


def run(work: Path, limit_s: float = TIMEOUT_S) -> list[PytestRun]:
    """Every group in its own pytest process, all of them within ``limit_s`` (and each
    within ``TIMEOUT_S``): a group that would start past it is reported as not run."""
    deadline = time.monotonic() + limit_s
    found = []
    for group, files in groups(marked_files(ROOT / "tests"), ROOT / "tests").items():
        left = min(TIMEOUT_S, deadline - time.monotonic())
        if left < 1:
            found.append(PytestRun(group, note=f"not run: the tests' {limit_s:.0f} s were spent"))
            continue
        found.append(run_group(group, files, work, left))
    return found


def run_group(group: str, files: list[str], work: Path, timeout_s: float = TIMEOUT_S) -> PytestRun:
    junit = work / f"junit-{group.replace('/', '-')}.xml"
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q",
            "--continue-on-collection-errors", f"--junitxml={junit}", *files]  # fmt: skip
    print(f"  pytest -m gpu: {len(files)} files under {group}", flush=True)
    started = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return PytestRun(group, seconds=time.monotonic() - started, note=f"over {timeout_s:.0f} s")
    seconds = time.monotonic() - started
    tail = (done.stdout.strip().splitlines() or ["no output"])[-1]
    print(f"    {tail}", flush=True)
    if not junit.exists():
        return PytestRun(group, seconds=seconds, note=f"pytest exit {done.returncode}: {tail}")
    return parse_junit(group, junit.read_text(), seconds)
