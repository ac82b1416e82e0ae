"""`--model-config-name NAME`: Triton's choice of ``<model>/configs/NAME.pbtxt`` over
config.pbtxt, for serving, repository loads and `repo validate` alike."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from batchserve.cli import build_parser, main
from batchserve.core.settings import Settings
from batchserve.models.load_override import LoadOverride
from batchserve.models.model_config import parse_pbtxt
from batchserve.models.model_directory import InvalidModel
from batchserve.models.repository import ModelRepository
from batchserve.proto.model_config_pb2 import ModelInstanceGroup
from batchserve.runtime.serve_command import settings_from_args
from onnx_models import write_model

CPU, GPU = ModelInstanceGroup.KIND_CPU, ModelInstanceGroup.KIND_GPU


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Two models: ``variants`` has configs/cpu.pbtxt beside its config.pbtxt, ``plain`` not."""
    for name in ("variants", "plain"):
        write_model(tmp_path / name / "1" / "model.onnx")
        (tmp_path / name / "config.pbtxt").write_text("max_batch_size: 8")
    configs = tmp_path / "variants" / "configs"
    configs.mkdir()
    (configs / "cpu.pbtxt").write_text(
        'name: "variants"\nmax_batch_size: 4\ninstance_group [{ kind: KIND_CPU count: 2 }]\n'
    )
    return tmp_path


def test_the_named_config_is_read_where_it_exists(repo: Path) -> None:
    model = ModelRepository(repo, "cpu").resolve("variants")
    assert model.config.max_batch_size == 4
    assert [(g.kind, g.count) for g in model.config.instance_group] == [(CPU, 2)]
    assert model.config_file == "variants/configs/cpu.pbtxt"
    assert [v.version for v in model.versions] == [1], "configs/ is not a version directory"


def test_config_pbtxt_is_read_where_the_named_config_is_absent(repo: Path) -> None:
    model = ModelRepository(repo, "cpu").resolve("plain")
    assert model.config.max_batch_size == 8
    assert model.config_file == "plain/config.pbtxt"


def test_without_a_name_the_configs_folder_is_ignored(repo: Path) -> None:
    model = ModelRepository(repo).resolve("variants")
    assert model.config.max_batch_size == 8
    assert model.config_file == "variants/config.pbtxt"


def test_a_named_config_is_completed_from_the_model_file_without_config_pbtxt(
    repo: Path,
) -> None:
    """A named config replaces config.pbtxt whole (Triton merges nothing), and is completed
    from the model file as config.pbtxt would be."""
    (repo / "variants" / "config.pbtxt").unlink()
    config = ModelRepository(repo, "cpu").resolve("variants").config
    assert [t.name for t in config.input] == ["image"]
    assert config.max_batch_size == 4


def test_with_neither_file_the_model_file_alone_makes_the_config(repo: Path) -> None:
    (repo / "plain" / "config.pbtxt").unlink()
    model = ModelRepository(repo, "cpu").resolve("plain")
    assert [t.name for t in model.config.input] == ["image"]


def test_the_name_inside_a_named_config_must_be_the_directory_name(repo: Path) -> None:
    """As Triton checks it: a copied config left naming another model is refused, naming
    the file at fault."""
    (repo / "variants" / "configs" / "cpu.pbtxt").write_text('name: "other"')
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(repo, "cpu").resolve("variants")
    assert caught.value.problems == (
        "variants/configs/cpu.pbtxt: name 'other' differs from the model directory name 'variants'",
    )


def test_a_broken_named_config_is_reported_as_that_file(repo: Path) -> None:
    (repo / "variants" / "configs" / "cpu.pbtxt").write_text("max_batch_size: lots")
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(repo, "cpu").resolve("variants")
    assert caught.value.problems[0].startswith("variants/configs/cpu.pbtxt: 1:17 : ")


def test_a_named_config_leading_outside_the_repository_is_refused(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside") / "cpu.pbtxt"
    outside.write_text("max_batch_size: 2")
    named = repo / "variants" / "configs" / "cpu.pbtxt"
    named.unlink()
    os.symlink(outside, named)
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(repo, "cpu").resolve("variants")
    assert caught.value.problems == (
        "variants/configs/cpu.pbtxt: leads outside the repository (through a symlink)",
    )


def test_a_loads_config_override_wins_over_the_named_config(repo: Path) -> None:
    """Triton's load parameter ``config`` replaces whatever file would have been read."""
    override = LoadOverride(config=parse_pbtxt("max_batch_size: 2"))
    model = ModelRepository(repo, "cpu").resolve("variants", override.config)
    assert model.config.max_batch_size == 2
    assert model.config_file == "variants: load parameter 'config'"


# --- the flag -------------------------------------------------------------------------------


def test_the_flag_wins_over_the_variable_which_wins_over_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BATCHSERVE_MODEL_CONFIG_NAME", raising=False)
    assert Settings().model_config_name is None
    monkeypatch.setenv("BATCHSERVE_MODEL_CONFIG_NAME", "gpu")
    assert settings_from_args(build_parser().parse_args(["serve"])).model_config_name == "gpu"
    flagged = build_parser().parse_args(["serve", "--model-config-name", "cpu"])
    assert settings_from_args(flagged).model_config_name == "cpu"


@pytest.mark.parametrize("name", ["", "h 100", "../cpu", "a/b", ".hidden", "a\\b", "a\x01"])
def test_a_name_that_is_not_a_plain_file_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="--model-config-name must name a file"):
        Settings(model_config_name=name)


def test_repo_validate_checks_what_the_named_configs_serve(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["repo", "validate", str(repo), "--model-config-name", "cpu"]) == 0
    out = capsys.readouterr().out
    variants = out.split("# variants: valid\n")[1]
    assert variants.startswith("#   config from variants/configs/cpu.pbtxt\n")
    assert parse_pbtxt(variants.split("2 models:")[0]).max_batch_size == 4  # sorted: last
    assert "# plain: valid\n#   config from plain/config.pbtxt\n" in out
    (repo / "plain" / "config.pbtxt").unlink()
    assert main(["repo", "validate", str(repo), "--model-config-name", "cpu"]) == 0
    assert "# plain: valid\n#   config from the model file alone\n" in capsys.readouterr().out


def test_repo_validate_refuses_a_name_the_server_would_refuse(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["repo", "validate", str(repo), "--model-config-name", "../x"]) == 2
    assert "--model-config-name must name a file" in capsys.readouterr().err
