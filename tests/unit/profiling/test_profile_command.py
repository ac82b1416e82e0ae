"""`batchserve profile`: what it refuses before measuring anything, and the exit codes."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from batchserve.cli import main

MODEL_REPO = Path(__file__).resolve().parents[3] / "model_repo"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    return tmp_path


def profile(repo: Path, *flags: str) -> list[str]:
    return ["profile", "digits_cnn", "--model-repository", str(repo), "--quick", *flags]


@pytest.mark.parametrize(
    ("model", "message"),
    [("nothing", "no model 'nothing' in"), ("../digits_cnn", "model name")],
)
def test_a_model_not_in_the_repository_exits_2_naming_it(
    repo: Path, model: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profile", model, "--model-repository", str(repo)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("batchserve profile: error: ")
    assert message in err


def test_a_perf_analyzer_that_is_not_a_program_exits_2(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_program = repo / "digits_cnn" / "config.pbtxt"
    assert main(profile(repo, "--perf-analyzer", str(not_a_program))) == 2
    assert "not an executable file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--concurrency", "0,4"], "--concurrency: every value must be 1 or more"),
        (["--model-config-name", "../cpu"], "--model-config-name must name a file"),
        (["--shape", "image:8x8"], "--shape 'image:8x8': expected NAME:D1[,D2...]"),
    ],
)
def test_bad_values_exit_2_before_any_server_starts(
    repo: Path, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(profile(repo, "--perf-analyzer", sys.executable, *flags)) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [
        ["--dry-run", "--output", "x.pbtxt"],
        ["--instance-counts", "one,two"],
        ["--latency-budget", "0"],
        ["--protocol", "ws"],
    ],
)
def test_argument_errors_are_argparses(
    repo: Path, flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(profile(repo, *flags))
    assert exit_info.value.code == 2
    assert "usage: batchserve profile" in capsys.readouterr().err
