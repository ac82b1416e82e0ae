"""Stage-by-stage progress on stderr at a terminal; nothing extra with --quiet or in a pipe.

The terminal is a real pseudo-terminal given to a `batchserve export` process as its stderr,
as a person's shell gives it; stdout stays a pipe, as when a script reads the results.
"""

import os
import pty
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LINEAR = (
    *("torch.nn:Linear", "--factory-kwargs", '{"in_features": 4, "out_features": 2}'),
    *("--input", "input:FP32:batch,4", "--name", "linear"),
)


@dataclass(frozen=True)
class TerminalRun:
    code: int
    out: str
    err: str


def run_with_terminal_stderr(*argv: str) -> TerminalRun:
    """`batchserve export` with stderr on a pseudo-terminal and stdout on a pipe."""
    leader, follower = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the process closed the terminal
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "batchserve.cli", "export", *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        os.close(follower)
    reader.join(timeout=10)
    os.close(leader)
    err = b"".join(chunks).decode().replace("\r\n", "\n")  # the terminal turns \n into \r\n
    return TerminalRun(done.returncode, done.stdout, err)


def test_a_terminal_sees_each_stage_and_a_summary(tmp_path: Path) -> None:
    repo = tmp_path / "repo"

    result = run_with_terminal_stderr(*LINEAR, "--model-repository", str(repo))

    assert result.code == 0, result.err
    lines = result.err.splitlines()
    stages = [re.sub(r"\d+(\.\d+)? m?s", "T", line) for line in lines[:-1]]
    assert stages == [
        "batchserve export: load: torch.nn:Linear ...",
        "batchserve export: load: done in T",
        "batchserve export: check: Linear.forward on the declared inputs ...",
        "batchserve export: check: done in T",
        "batchserve export: export: Linear to ONNX (opset 17) ...",
        "batchserve export: export: done in T",
        "batchserve export: verify: ONNX Runtime vs PyTorch, 3 cases ...",
        "batchserve export: verify: done in T",
        f"batchserve export: publish: linear into {repo} ...",
        "batchserve export: publish: done in T",
    ]
    assert re.fullmatch(
        r"batchserve export: exported 'linear' \(ONNX Runtime vs PyTorch within tolerance in 3 "
        r"cases, max abs error \S+\) in \S+ m?s; load \S+ m?s, check \S+ m?s, export \S+ m?s, "
        r"verify \S+ m?s, publish \S+ m?s",
        lines[-1],
    )
    # stdout is what it is without a terminal: the table and the summary, no progress
    assert "batch=8: output0 max abs" in result.out
    assert "exported 'linear': " in result.out
    assert "done in" not in result.out


def test_a_failing_stage_is_named_before_the_error(tmp_path: Path) -> None:
    result = run_with_terminal_stderr(
        *LINEAR, "--model-repository", str(tmp_path), "--input", "extra:FP32:batch,4"
    )

    assert result.code == 2
    lines = result.err.splitlines()
    assert re.fullmatch(r"batchserve export: check: failed after \S+ m?s", lines[-2])
    assert lines[-1].startswith("batchserve export: error: 2 input(s) declared (input, extra)")


def test_quiet_writes_no_progress_and_only_the_summary(tmp_path: Path) -> None:
    result = run_with_terminal_stderr(*LINEAR, "--model-repository", str(tmp_path), "--quiet")

    assert result.code == 0, result.err
    assert result.err == ""
    assert result.out.startswith("exported 'linear': ")
    assert "batch=" not in result.out


def test_no_progress_when_stderr_is_not_a_terminal(
    export_cli: Callable[..., Any], repo: Path
) -> None:
    result = export_cli(*LINEAR)  # pytest's captured stderr is no terminal

    assert result.code == 0, result.err
    assert result.err == ""
    assert "batch=8: output0 max abs" in result.out
