"""`batchserve repo validate DIR`: what it prints and the exit codes."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
from batchserve.cli import main
from batchserve.models.model_config import parse_pbtxt
from onnx_models import write_model


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for name in ("alpha", "beta"):
        write_model(tmp_path / name / "1" / "model.onnx")
    write_model(tmp_path / "alpha" / "2" / "model.onnx")
    (tmp_path / "alpha" / "config.pbtxt").write_text("version_policy { all {} }")
    return tmp_path


def break_beta(repo: Path) -> None:
    (repo / "beta" / "config.pbtxt").write_text(
        'max_batch_size: -1\ninput { name: "image" data_type: TYPE_INT8 }\n'
    )


def test_valid_repository_prints_each_resolved_config(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["repo", "validate", str(repo)]) == 0
    out = capsys.readouterr().out
    alpha = out.split("# beta: valid")[0]
    assert alpha.startswith("# alpha: valid\n")
    assert "#   serves version 1 from alpha/1/model.onnx\n" in alpha
    assert "#   serves version 2 from alpha/2/model.onnx\n" in alpha
    config = parse_pbtxt(alpha)  # the block is a config.pbtxt a user can copy
    assert config.name == "alpha"
    assert list(config.input[0].dims) == [1, 8, 8]
    assert out.endswith("2 models: 2 valid, 0 invalid\n")


def test_problems_are_listed_one_per_line_and_the_exit_code_is_1(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    break_beta(repo)
    assert main(["repo", "validate", str(repo)]) == 1
    out = capsys.readouterr().out
    assert "# alpha: valid" in out
    beta = out.split("# beta: invalid (2 problems)\n")[1].splitlines()
    assert beta[:2] == [
        "beta/config.pbtxt: 'max_batch_size' must be non-negative value for beta "
        "(batchserve: max_batch_size -1 is negative)",
        "beta/config.pbtxt: input 'image': data_type TYPE_INT8 contradicts the model's TYPE_FP32 "
        "(beta/1/model.onnx)",
    ]
    assert out.endswith("2 models: 1 valid, 1 invalid\n")


def test_with_completion_off_it_checks_as_such_a_server_serves(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model files alone make valid models, until completion is turned off."""
    assert main(["repo", "validate", "-q", str(repo), "--disable-auto-complete-config"]) == 1
    out = capsys.readouterr().out
    assert "alpha/config.pbtxt: it lists no inputs; with --disable-auto-complete-config" in out
    assert "beta/config.pbtxt: it lists no outputs; with --disable-auto-complete-config" in out
    assert main(["repo", "validate", "-q", str(repo)]) == 0


def test_quiet_prints_only_the_problems(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repo", "validate", "--quiet", str(repo)]) == 0
    assert capsys.readouterr().out == ""
    break_beta(repo)
    assert main(["repo", "validate", "-q", str(repo)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all(line.startswith("beta/config.pbtxt: ") for line in lines)


class Terminal(io.StringIO):
    """stderr as a person's terminal: the command decides on progress from isatty()."""

    def isatty(self) -> bool:
        return True


def test_a_terminal_sees_each_model_and_a_summary(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    break_beta(repo)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)

    assert main(["repo", "validate", str(repo)]) == 1

    lines = terminal.getvalue().splitlines()
    assert lines[:2] == [
        "batchserve repo validate: [1/2] alpha: valid, serves versions 1, 2",
        "batchserve repo validate: [2/2] beta: invalid",
    ]
    assert re.fullmatch(
        r"batchserve repo validate: checked 2 models: 1 valid, 1 invalid \(beta\) in \S+ m?s",
        lines[2],
    )
    assert len(lines) == 3
    out = capsys.readouterr().out  # stdout is unchanged: no progress in it
    assert "[1/2]" not in out
    assert out.endswith("2 models: 1 valid, 1 invalid\n")


def test_quiet_or_no_terminal_means_no_progress(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["repo", "validate", str(repo)]) == 0
    assert capsys.readouterr().err == ""  # pytest's captured stderr is no terminal
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["repo", "validate", "--quiet", str(repo)]) == 0
    assert terminal.getvalue() == ""


def test_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repo", "validate", str(tmp_path / "nope")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "is not a directory" in captured.err


def test_empty_repository_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repo", "validate", str(tmp_path)]) == 1
    assert "no model directories" in capsys.readouterr().err


def test_repo_needs_an_action(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["repo"])
    assert exited.value.code == 2
    assert "ACTION" in capsys.readouterr().err
