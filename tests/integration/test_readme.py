"""Every command the README shows is run here, so the README cannot drift from the code.

Indented blocks are read as commands (continuation lines joined, trailing comments
dropped); the config.pbtxt example is checked by loading it. A command of a kind this file
does not know fails the test, so a new README command must be covered here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.server import MODEL_REPO, REPO_ROOT, ServerProcess, start_server

README = REPO_ROOT / "README.md"
BIN = Path(sys.executable).parent
# Commands that cannot run inside the test suite, and why.
NOT_RUN_HERE = {
    "make test": "it is what CI runs: this suite is part of it",
}


def _blocks() -> list[list[str]]:
    """Indented blocks (4 spaces, after a blank line) outside tables and fenced code."""
    blocks: list[list[str]] = []
    current: list[str] = []
    previous_blank = True
    for line in README.read_text().splitlines():
        if line.startswith("    ") and (current or previous_blank):
            current.append(line[4:])
        elif current:
            blocks.append(current)
            current = []
        previous_blank = not line.strip()
    if current:
        blocks.append(current)
    return blocks


def _commands(block: list[str]) -> list[str]:
    joined = "\n".join(block).replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()
        if command:
            commands.append(re.sub(r"\s+", " ", command))
    return commands


def _shell_blocks() -> list[str]:
    commands: list[str] = []
    for block in _blocks():
        if block[0].startswith(("max_batch_size", "dynamic_batching")):
            continue  # the config example: checked by test_config_example_is_valid
        commands.extend(_commands(block))
    return commands


COMMANDS = _shell_blocks()


def _run(command: list[str] | str, cwd: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env_path = f"{BIN}:{Path('/usr/bin')}:{Path('/bin')}"
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        command, cwd=cwd, capture_output=True, text=True, timeout=600,
        env={"PATH": env_path, "HOME": str(cwd)}, **kwargs,
    )  # fmt: skip


def test_every_readme_command_is_known() -> None:
    kinds = ("make ", "curl ", "batchserve ")
    unknown = [c for c in COMMANDS if not c.startswith(kinds)]
    assert not unknown, f"README commands this test does not run: {unknown}"
    assert len(COMMANDS) >= 8


def test_make_serve_runs_the_documented_command() -> None:
    assert "make serve" in COMMANDS
    makefile = (REPO_ROOT / "Makefile").read_text()
    recipe = makefile.split("\nserve:", 1)[1].split("\n\n", 1)[0]
    assert "batchserve serve --model-repository $(MODEL_REPO)" in recipe
    assert "batchserve serve --model-repository model_repo" in COMMANDS


@pytest.fixture(scope="module")
def readme_server() -> Iterator[ServerProcess]:
    """The README's serve command on free ports (the README's fixed ports may be taken)."""
    (serve,) = [c for c in COMMANDS if c.startswith("batchserve serve")]
    server = start_server(MODEL_REPO, serve.split()[4:])
    yield server
    assert server.stop() == 0


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith("curl ")])
def test_curl_commands(readme_server: ServerProcess, command: str) -> None:
    command = command.replace("localhost:8000", readme_server.http_url)
    result = _run(command.replace("curl ", "curl --fail-with-body ", 1), REPO_ROOT, shell=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("{")


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith("batchserve export")])
def test_export_commands(tmp_path: Path, command: str) -> None:
    result = _run([str(BIN / "batchserve"), *command.split()[1:]], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    name = command.split("--name ")[1].split()[0]
    assert (tmp_path / "my_repo" / name / "1" / "model.onnx").is_file()
    assert (tmp_path / "my_repo" / name / "config.pbtxt").is_file()


def test_repo_validate_command() -> None:
    (command,) = [c for c in COMMANDS if c.startswith("batchserve repo validate")]
    result = _run([str(BIN / "batchserve"), *command.split()[1:]], REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "digits_cnn" in result.stdout


def test_config_example_is_valid(tmp_path: Path) -> None:
    (block,) = [b for b in _blocks() if b[0].startswith("max_batch_size")]
    config = "\n".join(line.split("#")[0] for line in block)
    config = config.replace("KIND_GPU", "KIND_CPU")  # no GPU here; the rest must hold as written
    model = tmp_path / "digits_cnn"
    shutil.copytree(MODEL_REPO / "digits_cnn", model)
    text = (model / "config.pbtxt").read_text()
    kept = "\n".join(line for line in text.splitlines() if not line.startswith("max_batch_size"))
    kept = re.sub(r"dynamic_batching \{[^}]*\}\n", "", kept)  # the example brings its own
    (model / "config.pbtxt").write_text(kept + "\n" + config + "\n")
    result = _run([str(BIN / "batchserve"), "repo", "validate", str(tmp_path)], REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "preferred_batch_size: [16, 32]" in result.stdout


def test_documented_kustomize_overlays_render() -> None:
    overlays = re.findall(r"kubectl apply -k (\S+?)`", README.read_text())
    assert overlays
    for overlay in overlays:
        path = overlay if not overlay.startswith("...") else "deploy/k8s/overlays" + overlay[3:]
        result = _run([str(BIN / "kubectl"), "kustomize", path], REPO_ROOT)
        assert result.returncode == 0, result.stderr
        assert "kind: Deployment" in result.stdout


def test_commands_not_run_here_are_few_and_explained() -> None:
    skipped = [c for c in COMMANDS if c in NOT_RUN_HERE]
    assert skipped == ["make test"]
