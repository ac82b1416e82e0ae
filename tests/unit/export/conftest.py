"""Run `batchserve export` the way users do, through the console script's main()."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from batchserve.cli import main


@dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str


ExportCli = Callable[..., CliResult]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return tmp_path / "model_repo"


@pytest.fixture
def export_cli(capsys: pytest.CaptureFixture[str], repo: Path) -> ExportCli:
    def run(*argv: str) -> CliResult:
        code = main(["export", *argv, "--model-repository", str(repo)])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run
