"""The model repository: layout, completion of minimal entries, versions, scan, and escapes."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from batchserve.backends.selection import ONNX
from batchserve.core.backend_config import parse_backend_config
from batchserve.core.errors import InvalidArgument, ModelConfigError, ModelFileError, NotFound
from batchserve.core.settings import Settings
from batchserve.devices.placement import gpu_count
from batchserve.models.model_config import (
    DEFAULT_MAX_BATCH_SIZE,
    MAX_CONFIG_BYTES,
    complete_config,
    parse_pbtxt,
)
from batchserve.models.model_directory import InvalidModel, ModelVersion
from batchserve.models.repository import ModelProblem, ModelRepository, startup_models
from onnx_models import (
    FP32,
    build_model,
    with_external_in_subgraph,
    with_external_initializer,
    write_model,
)
from pydantic import ValidationError


def add_model(root: Path, name: str = "digits", versions: tuple[int, ...] = (1,)) -> Path:
    for version in versions:
        write_model(root / name / str(version) / "model.onnx")
    return root / name


def problems(root: Path, name: str = "digits") -> tuple[str, ...]:
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(root).resolve(name)
    return caught.value.problems


# --- a minimal entry, and a full Triton config ---------------------------------------------------


def test_model_file_alone_resolves_to_a_complete_config(tmp_path: Path) -> None:
    add_model(tmp_path)
    model = ModelRepository(tmp_path).resolve("digits")
    assert model.name == "digits"
    assert model.versions == (ModelVersion(1, tmp_path / "digits" / "1" / "model.onnx"),)
    config = model.config
    assert (config.name, config.platform, config.backend) == (
        "digits",
        "onnxruntime_onnx",
        "onnxruntime",
    )
    assert config.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    assert config.HasField("dynamic_batching")
    assert [(t.name, list(t.dims)) for t in config.input] == [("image", [1, 8, 8])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("logits", [10])]
    assert [g.count for g in config.instance_group] == [1]
    assert config.version_policy.latest.num_versions == 1


TRITON_CONFIG = """
name: "digits"
platform: "onnxruntime_onnx"
max_batch_size: 16
version_policy: { all { } }
input [
  {
    name: "image"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 1, 8, 8 ]
  }
]
output [
  {
    name: "logits"
    data_type: TYPE_FP32
    dims: [ 10 ]
    label_filename: "labels.txt"
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
}
instance_group [ { count: 2, kind: KIND_CPU } ]
optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
model_warmup [ { name: "zeros" batch_size: 1 inputs { key: "image" value: {
  data_type: TYPE_FP32 dims: [ 1, 8, 8 ] zero_data: true } } } ]
batchserve { memory_budget_bytes: 1048576 latency_objective_microseconds: 20000 }
"""


def test_full_triton_config_is_kept_as_written(tmp_path: Path) -> None:
    add_model(tmp_path, versions=(1, 2))
    (tmp_path / "digits" / "config.pbtxt").write_text(TRITON_CONFIG)
    (tmp_path / "digits" / "labels.txt").write_text("zero\none\n")
    model = ModelRepository(tmp_path).resolve("digits")
    assert [v.version for v in model.versions] == [1, 2]
    assert model.labels == {"logits": (b"zero", b"one")}
    config = model.config
    # the fields completion adds, as Triton's normalization adds them
    assert config.backend == "onnxruntime"
    assert config.default_model_filename == "model.onnx"
    assert [group.name for group in config.instance_group] == ["digits_0"]
    pinned = config.optimization
    assert pinned.input_pinned_memory.enable
    assert pinned.output_pinned_memory.enable
    config.ClearField("backend")
    config.ClearField("default_model_filename")
    config.instance_group[0].ClearField("name")
    pinned.ClearField("input_pinned_memory")
    pinned.ClearField("output_pinned_memory")
    assert config == parse_pbtxt(TRITON_CONFIG)  # preferred sizes as written, not replaced


@pytest.mark.parametrize(
    ("written", "normalized"),
    [
        ("max_batch_size: 8 dynamic_batching { }", "dynamic_batching { preferred_batch_size: 8 }"),
        ("dynamic_batching { }", "dynamic_batching { }"),  # no batching: nothing preferred
        (
            "max_batch_size: 8 sequence_batching { oldest { } }",
            "sequence_batching { max_sequence_idle_microseconds: 1000000 "
            "oldest { preferred_batch_size: 8 } }",
        ),
        (
            "sequence_batching { max_sequence_idle_microseconds: 5 }",
            "sequence_batching { max_sequence_idle_microseconds: 5 }",
        ),
    ],
)
def test_scheduler_defaults_are_written_as_tritons_normalization_writes_them(
    written: str, normalized: str
) -> None:
    config = complete_config(
        parse_pbtxt(f'name: "m" {written}'), name="m", model_format=ONNX, signature=None
    )
    expected = parse_pbtxt(normalized)
    assert config.dynamic_batching == expected.dynamic_batching
    assert config.sequence_batching == expected.sequence_batching
    assert config.optimization.input_pinned_memory.enable
    assert config.optimization.output_pinned_memory.enable


def test_pinned_memory_written_off_stays_off() -> None:
    written = parse_pbtxt('name: "m" optimization { input_pinned_memory { enable: false } }')
    config = complete_config(written, name="m", model_format=ONNX, signature=None)
    assert config.optimization.input_pinned_memory == written.optimization.input_pinned_memory
    assert config.optimization.output_pinned_memory.enable


def test_instance_groups_are_named_as_triton_names_them(tmp_path: Path) -> None:
    add_model(tmp_path)
    config_file = tmp_path / "digits" / "config.pbtxt"
    config_file.write_text("")
    added = ModelRepository(tmp_path).resolve("digits").config
    assert [group.name for group in added.instance_group] == ["digits"]
    config_file.write_text(
        'instance_group [ { count: 1 kind: KIND_CPU }, { name: "mine" kind: KIND_CPU }, '
        "{ kind: KIND_CPU } ]"
    )
    listed = ModelRepository(tmp_path).resolve("digits").config
    assert [group.name for group in listed.instance_group] == ["digits_0", "mine", "digits_2"]
    config_file.write_text('default_model_filename: "model.onnx"')
    assert ModelRepository(tmp_path).resolve("digits").config.default_model_filename == "model.onnx"


def test_a_missing_label_file_fails_the_model(tmp_path: Path) -> None:
    add_model(tmp_path)
    (tmp_path / "digits" / "config.pbtxt").write_text(TRITON_CONFIG)
    assert problems(tmp_path) == (
        "digits/config.pbtxt: output 'logits': label_filename 'labels.txt': "
        "does not exist or is not a file",
    )


# --- versions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ("", [3]),
        ("version_policy { latest { num_versions: 2 } }", [2, 3]),
        ("version_policy { all {} }", [1, 2, 3]),
        ("version_policy { specific { versions: [3, 1] } }", [1, 3]),
    ],
)
def test_version_policy_picks_the_served_versions(
    tmp_path: Path, policy: str, served: list[int]
) -> None:
    model_dir = add_model(tmp_path, versions=(1, 2, 3))
    (model_dir / "config.pbtxt").write_text(policy)
    model = ModelRepository(tmp_path).resolve("digits")
    assert [v.version for v in model.versions] == served
    assert [v.model_file for v in model.versions] == [
        model_dir / str(n) / "model.onnx" for n in served
    ]


def test_entries_that_are_not_version_directories_are_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model_dir = add_model(tmp_path, versions=(2, 2**63 - 1))
    for name in ("01", "0", "latest", "10.5", str(2**63)):  # past int64: no Triton version
        (model_dir / name).mkdir()
    (model_dir / "7").write_text("a file, not a directory")
    (model_dir / "README.md").write_text("notes")
    (model_dir / "config.pbtxt").write_text("version_policy { all {} }")
    with caplog.at_level(logging.DEBUG, logger="batchserve.models.model_directory"):
        model = ModelRepository(tmp_path).resolve("digits")
    assert [v.version for v in model.versions] == [2, 2**63 - 1]
    # Triton's warnings for the directories, a debug line for the files
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sorted(warned) == sorted([
        "digits: ignore version directory '01' which contains leading zeros in its directory "
        "name",
        "digits: ignore version directory '0': versions start at 1",
        "digits: ignore version directory 'latest' which fails to convert to integral number",
        "digits: ignore version directory '10.5' which fails to convert to integral number",
        f"digits: ignore version directory '{2**63}' which is past the largest version "
        f"({2**63 - 1})",
    ])  # fmt: skip
    assert "ignoring README.md" in caplog.text


def test_specific_versions_that_do_not_exist_are_said_and_the_others_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As Triton (L0_lifecycle's file-override test serves version 3 of [1, 3] once 1 is
    gone); with none of them present, the model fails as Triton's does."""
    model_dir = add_model(tmp_path, versions=(1,))
    (model_dir / "config.pbtxt").write_text("version_policy { specific { versions: [1, 4] } }")
    with caplog.at_level(logging.ERROR, logger="batchserve.models.model_directory"):
        model = ModelRepository(tmp_path).resolve("digits")
    assert [v.version for v in model.versions] == [1]
    assert (
        "version 4 is specified for model 'digits', but the version directory is not present"
        in caplog.text
    )
    (model_dir / "config.pbtxt").write_text("version_policy { specific { versions: [4] } }")
    with pytest.raises(ModelFileError) as none_present:
        ModelRepository(tmp_path).resolve("digits")
    assert none_present.value.message.startswith(
        "at least one version must be available under the version policy of model 'digits'"
    )


NO_BACKEND = (
    "digits: Invalid model name: Could not determine backend for model 'digits' with no "
    "backend in model configuration. Expected model name of the form 'model.<backend_name>'."
)
"""Triton's words when neither the config nor a model file tells the backend."""


def test_no_version_directory(tmp_path: Path) -> None:
    (tmp_path / "digits").mkdir()
    assert problems(tmp_path) == (
        NO_BACKEND,
        "digits: no version directory (expected e.g. digits/1/model.onnx)",
    )


def test_served_version_without_the_model_file(tmp_path: Path) -> None:
    model_dir = add_model(tmp_path, versions=(1,))
    (model_dir / "2").mkdir()
    assert problems(tmp_path) == ("digits/2: version directory has no model.onnx",)


def test_every_served_version_is_checked_against_the_config(tmp_path: Path) -> None:
    model_dir = add_model(tmp_path, versions=(2,))
    write_model(model_dir / "1" / "model.onnx", build_model([("image", FP32, ("N", 1, 7, 7))]))
    (model_dir / "config.pbtxt").write_text("version_policy { all {} }")
    assert problems(tmp_path) == (
        "digits/config.pbtxt: model 'digits', tensor 'image': the model expects 4 dimensions "
        "(shape [-1,1,7,7]) but the model configuration specifies 4 dimensions (an initial "
        "batch dimension because max_batch_size > 0 followed by the explicit tensor shape, "
        "making complete shape [-1,1,8,8]) (batchserve: input 'image': dims [1, 8, 8] "
        "contradict the model's [1, 7, 7]) (digits/1/model.onnx)",
    )


def test_problems_found_only_in_model_files_are_told_apart_from_config_problems(
    tmp_path: Path,
) -> None:
    """Triton polls the config and loads the files: a model refused only by its files is a
    ModelFileError (its load failed), one with a problem in the config alone is not."""
    model_dir = add_model(tmp_path, versions=(1,))
    (model_dir / "2").mkdir()  # no model file
    (model_dir / "config.pbtxt").write_text("version_policy { all {} }")
    with pytest.raises(ModelFileError):
        ModelRepository(tmp_path).resolve("digits")
    (model_dir / "config.pbtxt").write_text("version_policy { all {} }\nmax_batch_size: -2")
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(tmp_path).resolve("digits")
    assert not isinstance(caught.value, ModelFileError)
    assert len(caught.value.problems) == 2  # both told, as before


# --- which file, which backend -------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["model.pt", "model.savedmodel", "model.py"])
def test_other_frameworks_are_a_clear_error(tmp_path: Path, entry: str) -> None:
    version_dir = tmp_path / "digits" / "1"
    version_dir.mkdir(parents=True)
    if entry.endswith("savedmodel"):
        (version_dir / entry).mkdir()
    else:
        (version_dir / entry).write_bytes(b"not ours")
    assert problems(tmp_path) == (
        f"digits/1/{entry}: unsupported backend; batchserve serves ONNX (.onnx), "
        "TensorRT (.plan) and torch.export (.pt2, platform torch_export) models, and Triton's "
        "identity backend (no file)",
    )


def test_version_directory_without_any_model_file(tmp_path: Path) -> None:
    (tmp_path / "digits" / "1").mkdir(parents=True)
    assert problems(tmp_path) == (
        NO_BACKEND,
        "digits: no model file in any version directory "
        "(expected model.onnx, model.plan or model.pt2)",
    )


def test_a_model_named_for_a_backend_batchserve_lacks_is_refused_in_tritons_words(
    tmp_path: Path,
) -> None:
    """L0_model_config custom/unknown_backend.unknown: Triton takes a backend from a name
    ``model.<backend>`` when nothing else tells it, and finds no library for it."""
    (tmp_path / "digits.unknown" / "1").mkdir(parents=True)
    assert problems(tmp_path, "digits.unknown")[0] == (
        "digits.unknown: unable to find backend library for backend 'unknown', try specifying "
        "runtime on the model configuration. (batchserve: batchserve serves ONNX (.onnx), "
        "TensorRT (.plan) and torch.export (.pt2, platform torch_export) models, and Triton's "
        "identity backend (no file))"
    )


def test_onnx_and_plan_side_by_side_need_a_platform(tmp_path: Path) -> None:
    model_dir = add_model(tmp_path)
    (model_dir / "1" / "model.plan").write_bytes(b"engine")
    assert problems(tmp_path) == (
        "digits: both model.onnx and model.plan are present; set platform in digits/config.pbtxt",
    )
    (model_dir / "config.pbtxt").write_text('platform: "onnxruntime_onnx"')
    assert ModelRepository(tmp_path).resolve("digits").versions[0].model_file.suffix == ".onnx"


def test_default_model_filename_renames_the_file(tmp_path: Path) -> None:
    write_model(tmp_path / "digits" / "1" / "digits.onnx")
    (tmp_path / "digits" / "config.pbtxt").write_text('default_model_filename: "digits.onnx"')
    model = ModelRepository(tmp_path).resolve("digits")
    assert model.versions[0].model_file.name == "digits.onnx"
    assert model.config.platform == "onnxruntime_onnx"


@pytest.mark.parametrize(
    ("filename", "message"),
    [
        ("../digits.onnx", "default_model_filename '../digits.onnx' is not a plain file name"),
        ("model.pt", "default_model_filename 'model.pt' implies an unsupported backend"),
    ],
)
def test_bad_default_model_filename(tmp_path: Path, filename: str, message: str) -> None:
    add_model(tmp_path)
    (tmp_path / "digits" / "config.pbtxt").write_text(f'default_model_filename: "{filename}"')
    found = problems(tmp_path)
    assert len(found) == 1
    assert found[0].startswith(f"digits/config.pbtxt: {message}")


def test_unreadable_onnx_file(tmp_path: Path) -> None:
    (tmp_path / "digits" / "1").mkdir(parents=True)
    (tmp_path / "digits" / "1" / "model.onnx").write_bytes(b"\x00garbage")
    (found,) = problems(tmp_path)
    assert "model.onnx: not a readable ONNX model" in found


def test_unreadable_config_is_one_problem(tmp_path: Path) -> None:
    add_model(tmp_path)
    (tmp_path / "digits" / "config.pbtxt").write_bytes(b"name: \xff")
    (found,) = problems(tmp_path)
    assert found.startswith("digits/config.pbtxt: cannot read")


def test_a_config_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """Opening a FIFO for reading waits for a writer: the load, and shutdown behind it,
    would hang forever. It is opened without blocking and refused."""
    add_model(tmp_path)
    os.mkfifo(tmp_path / "digits" / "config.pbtxt")
    (found,) = problems(tmp_path)
    assert found == "digits/config.pbtxt: is not a regular file"


def test_a_config_over_the_size_limit_is_refused_unparsed(tmp_path: Path) -> None:
    add_model(tmp_path)
    text = 'parameters { key: "k" value { string_value: "v" } }\n'
    big = text * (MAX_CONFIG_BYTES // len(text) + 1)
    (tmp_path / "digits" / "config.pbtxt").write_text(big)
    (found,) = problems(tmp_path)
    assert found == (
        f"digits/config.pbtxt: is larger than {MAX_CONFIG_BYTES} bytes (the limit on config.pbtxt)"
    )


# --- TensorRT plans without a GPU ----------------------------------------------------------------

no_gpu = pytest.mark.skipif(gpu_count() > 0, reason="a GPU can read the engine; this tests none")

COMPLETE_PLAN_CONFIG = """
max_batch_size: 8
input { name: "image" data_type: TYPE_FP32 dims: [1, 8, 8] }
output { name: "logits" data_type: TYPE_FP32 dims: [10] }
"""


# --- completion off: Triton's --disable-auto-complete-config ----------------------------------


def test_with_completion_off_a_complete_config_is_served_as_written(tmp_path: Path) -> None:
    add_model(tmp_path)
    (tmp_path / "digits" / "config.pbtxt").write_text(COMPLETE_PLAN_CONFIG)
    config = ModelRepository(tmp_path, auto_complete=False).resolve("digits").config
    assert config.max_batch_size == 8
    assert not config.HasField("dynamic_batching"), "no scheduler added when none is written"
    assert [(t.name, list(t.dims)) for t in config.input] == [("image", [1, 8, 8])]
    assert (config.platform, [g.count for g in config.instance_group]) == ("onnxruntime_onnx", [1])


def test_with_completion_off_a_model_file_alone_is_refused_saying_what_to_write(
    tmp_path: Path,
) -> None:
    add_model(tmp_path)
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(tmp_path, auto_complete=False).resolve("digits")
    assert caught.value.problems == (
        *(
            f"digits/config.pbtxt: it lists no {kind}s; with --disable-auto-complete-config (or "
            "--strict-model-config true) nothing is filled in from the model file: the config "
            "must list every input and output with data_type and dims"
            for kind in ("input", "output")
        ),
        "digits/config.pbtxt: unable to load model 'digits', configuration expects 0 inputs, "
        "model provides 1 (digits/1/model.onnx)",
        "digits/config.pbtxt: model input 'image' is missing from the config's inputs "
        "(digits/1/model.onnx)",
    )


def test_with_completion_off_max_batch_size_0_is_no_batching_and_must_match_the_model(
    tmp_path: Path,
) -> None:
    """Completion would make this batchable model's 0 a batch cap of 32; off, 0 stays 0, and
    dims written without the batch axis no longer match the model's rank."""
    add_model(tmp_path)
    (tmp_path / "digits" / "config.pbtxt").write_text(COMPLETE_PLAN_CONFIG.replace("8\n", "0\n", 1))
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(tmp_path, auto_complete=False).resolve("digits")
    assert any("'image'" in problem for problem in caught.value.problems), caught.value.problems
    completed = ModelRepository(tmp_path).resolve("digits").config
    assert completed.max_batch_size == DEFAULT_MAX_BATCH_SIZE


@no_gpu
def test_plan_with_a_complete_config_is_accepted_as_written(tmp_path: Path) -> None:
    pytest.importorskip("batchserve.backends.tensorrt")
    (tmp_path / "digits" / "1").mkdir(parents=True)
    (tmp_path / "digits" / "1" / "model.plan").write_bytes(b"serialized engine")
    (tmp_path / "digits" / "config.pbtxt").write_text(COMPLETE_PLAN_CONFIG)
    model = ModelRepository(tmp_path).resolve("digits")
    assert (model.config.platform, model.config.backend) == ("tensorrt_plan", "tensorrt")
    assert model.config.max_batch_size == 8
    assert model.versions[0].model_file.name == "model.plan"


@no_gpu
def test_plan_with_an_incomplete_config_says_what_is_missing(tmp_path: Path) -> None:
    pytest.importorskip("batchserve.backends.tensorrt")
    (tmp_path / "digits" / "1").mkdir(parents=True)
    (tmp_path / "digits" / "1" / "model.plan").write_bytes(b"serialized engine")
    (tmp_path / "digits" / "config.pbtxt").write_text('input { name: "image" dims: [4] }')
    assert problems(tmp_path) == tuple(
        f"digits/config.pbtxt: {problem}; to validate digits/1/model.plan without a GPU, "
        "the config must list every input and output with data_type and dims"
        for problem in (
            "model input 'image' must specify 'data_type' for digits",
            "it lists no outputs",
        )
    )


# --- resolving by name, scanning, lookups ------------------------------------------------------


def test_resolve_refuses_bad_names_and_unknown_models(tmp_path: Path) -> None:
    repository = ModelRepository(tmp_path)
    with pytest.raises(InvalidArgument):
        repository.resolve("../etc")
    with pytest.raises(
        NotFound,
        match=r"^failed to load 'nope', failed to poll from model repository \(batchserve: model "
        "'nope' is not in the repository",
    ):
        repository.resolve("nope")


def test_invalid_model_is_a_model_config_error_carrying_every_problem(tmp_path: Path) -> None:
    add_model(tmp_path)
    (tmp_path / "digits" / "config.pbtxt").write_text('name: "x" max_batch_size: -1')
    with pytest.raises(ModelConfigError) as caught:
        ModelRepository(tmp_path).resolve("digits")
    assert isinstance(caught.value, InvalidModel)
    assert caught.value.message == "\n".join(caught.value.problems)
    assert len(caught.value.problems) == 2


def test_scan_reports_a_broken_entry_next_to_good_ones(tmp_path: Path) -> None:
    add_model(tmp_path, "alpha")
    add_model(tmp_path, "gamma")
    add_model(tmp_path, "beta")
    (tmp_path / "beta" / "config.pbtxt").write_text("max_batch_size: -3")
    add_model(tmp_path, "bad%name")
    (tmp_path / ".git").mkdir()
    (tmp_path / "README.md").write_text("models")
    repository = ModelRepository(tmp_path)
    assert repository.names() == ["alpha", "bad%name", "beta", "gamma"]
    resolved, broken = repository.scan()
    assert [m.name for m in resolved] == ["alpha", "gamma"]
    assert [p.name for p in broken] == ["bad%name", "beta"]
    assert "invalid model name 'bad%name'" in broken[0].errors[0]
    assert broken[1] == ModelProblem(
        "beta",
        (
            "beta/config.pbtxt: 'max_batch_size' must be non-negative value for beta "
            "(batchserve: max_batch_size -3 is negative)",
        ),
    )


def test_repository_root_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="is not a directory"):
        ModelRepository(tmp_path / "missing")
    (tmp_path / "present").mkdir()
    with pytest.raises(NotFound, match=r"'.*missing' is not a directory"):
        ModelRepository([tmp_path / "present", tmp_path / "missing"])


# --- several repositories, as Triton's --model-repository given again ---------------------------


def test_several_roots_serve_the_union_each_model_from_its_own_root(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    add_model(first, "alpha")
    add_model(second, "beta", versions=(3,))
    repository = ModelRepository([first, second, first])  # a root given twice counts once
    assert repository.roots == (first.resolve(), second.resolve())
    assert repository.names() == ["alpha", "beta"]
    assert repository.duplicates() == []
    beta = repository.resolve("beta")
    assert beta.directory == second.resolve() / "beta"
    assert beta.versions == (ModelVersion(3, second.resolve() / "beta" / "3" / "model.onnx"),)
    assert repository.resolve("alpha").directory == first.resolve() / "alpha"
    with pytest.raises(NotFound, match="not in the repository"):
        repository.resolve("gamma")


def test_a_model_in_two_roots_is_served_from_neither_with_tritons_reason(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    add_model(first, "twice")
    add_model(second, "twice")
    add_model(second, "once")
    repository = ModelRepository([first, second])
    assert repository.names() == ["once", "twice"]
    assert repository.duplicates() == ["twice"]
    assert repository.directories("twice") == [
        first.resolve() / "twice",
        second.resolve() / "twice",
    ]
    with pytest.raises(InvalidModel) as caught:
        repository.resolve("twice")
    [problem] = caught.value.problems
    assert problem.startswith("model appears in two or more repositories (batchserve: ")
    assert str(second.resolve()) in problem
    resolved, broken = repository.scan()
    assert [m.name for m in resolved] == ["once"]
    assert [p.name for p in broken] == ["twice"]


# --- escapes through symlinks and external data ---------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the repository, holding a valid model tree of its own."""
    add_model(tmp_path / "outside", "elsewhere")
    (tmp_path / "outside" / "config.pbtxt").write_text("")
    (tmp_path / "repo").mkdir()
    return tmp_path / "outside"


def test_symlinked_model_directory_outside_the_root(tmp_path: Path, outside: Path) -> None:
    os.symlink(outside / "elsewhere", tmp_path / "repo" / "digits")
    assert problems(tmp_path / "repo") == (
        "digits: the model directory leads outside the repository (through a symlink)",
    )


def test_symlinked_version_directory_outside_the_root(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "repo" / "digits").mkdir()
    os.symlink(outside / "elsewhere" / "1", tmp_path / "repo" / "digits" / "1")
    found = problems(tmp_path / "repo")
    assert (
        found[0] == "digits/1: version directory leads outside the repository (through a symlink)"
    )


def test_symlinked_model_file_outside_the_root(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "repo" / "digits" / "1").mkdir(parents=True)
    target = outside / "elsewhere" / "1" / "model.onnx"
    os.symlink(target, tmp_path / "repo" / "digits" / "1" / "model.onnx")
    assert problems(tmp_path / "repo") == (
        "digits/1/model.onnx: leads outside the repository (through a symlink)",
    )


def test_symlinked_config_outside_the_root(tmp_path: Path, outside: Path) -> None:
    add_model(tmp_path / "repo")
    os.symlink(outside / "config.pbtxt", tmp_path / "repo" / "digits" / "config.pbtxt")
    assert problems(tmp_path / "repo") == (
        "digits/config.pbtxt: leads outside the repository (through a symlink)",
    )


@pytest.mark.parametrize(
    ("looped", "problem"),
    [
        ("digits/1/model.onnx", "digits/1/model.onnx: is a symlink loop"),
        ("digits/config.pbtxt", "digits/config.pbtxt: is a symlink loop"),
        (
            "digits/labels.txt",
            "digits/config.pbtxt: output 'logits': label_filename 'labels.txt': is a symlink loop",
        ),
    ],
)
def test_a_symlink_loop_is_a_problem_of_the_model(
    tmp_path: Path, looped: str, problem: str
) -> None:
    """A link to itself used to raise out of the repository and stop the server."""
    add_model(tmp_path)
    (tmp_path / "digits" / "config.pbtxt").write_text(TRITON_CONFIG)
    (tmp_path / "digits" / "labels.txt").write_text("zero\n")
    (tmp_path / looped).unlink()
    (tmp_path / looped).symlink_to(Path(looped).name)
    assert problems(tmp_path) == (problem,)


def test_symlink_inside_the_root_is_fine(tmp_path: Path) -> None:
    add_model(tmp_path, "shared")
    (tmp_path / "digits" / "1").mkdir(parents=True)
    os.symlink(tmp_path / "shared" / "1" / "model.onnx", tmp_path / "digits" / "1" / "model.onnx")
    assert ModelRepository(tmp_path).resolve("digits").config.name == "digits"


def test_external_data_inside_the_version_directory(tmp_path: Path) -> None:
    version_dir = tmp_path / "digits" / "1"
    write_model(version_dir / "model.onnx", with_external_initializer("weights/w.bin"))
    (version_dir / "weights").mkdir()
    (version_dir / "weights" / "w.bin").write_bytes(bytes(8))
    assert ModelRepository(tmp_path).resolve("digits").versions[0].version == 1


@pytest.mark.parametrize(
    ("location", "problem"),
    [
        ("../w.bin", "tensor 'weight' keeps its data at '../w.bin', outside the version directory"),
        (
            "/srv/w.bin",
            "tensor 'weight' keeps its data at '/srv/w.bin', outside the version directory",
        ),
        ("link.bin", "tensor 'weight' keeps its data at 'link.bin', outside the version directory"),
        ("absent.bin", "tensor 'weight' keeps its data in 'absent.bin', which does not exist"),
        ("loop.bin", "tensor 'weight' keeps its data at 'loop.bin', which is a symlink loop"),
    ],
)
def test_external_data_that_escapes_or_is_missing(
    tmp_path: Path, location: str, problem: str
) -> None:
    version_dir = tmp_path / "repo" / "digits" / "1"
    write_model(version_dir / "model.onnx", with_external_initializer(location))
    (tmp_path / "repo" / "digits" / "w.bin").write_bytes(bytes(8))
    (tmp_path / "secret.bin").write_bytes(bytes(8))
    os.symlink(tmp_path / "secret.bin", version_dir / "link.bin")
    os.symlink("loop.bin", version_dir / "loop.bin")
    assert problems(tmp_path / "repo") == (f"digits/1/model.onnx: {problem}",)


def test_external_data_in_a_subgraph_is_checked(tmp_path: Path) -> None:
    write_model(tmp_path / "digits" / "1" / "model.onnx", with_external_in_subgraph("../../x"))
    assert problems(tmp_path) == (
        "digits/1/model.onnx: tensor 'deep' keeps its data at '../../x', outside the version "
        "directory",
    )


# --- the models a server loads as it starts -------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "named", "loaded"),
    [
        ("none", (), ["a", "b"]),
        ("explicit", (), []),
        ("explicit", ("b",), ["b"]),
        ("explicit", ("*",), ["a", "b"]),  # Triton's "every model"
    ],
)
def test_the_models_loaded_at_start(
    tmp_path: Path, mode: str, named: tuple[str, ...], loaded: list[str]
) -> None:
    for name in ("b", "a"):
        add_model(tmp_path, name)
    settings = Settings(model_repository=tmp_path, model_control_mode=mode, load_model=named)
    assert startup_models(settings, ModelRepository(tmp_path)) == loaded


def test_every_model_is_asked_for_alone(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"--load-model '\*' \(every model\) must be"):
        Settings(model_repository=tmp_path, load_model=("*", "a"))


def test_a_control_without_values_is_a_problem_of_the_config_not_a_crash(
    tmp_path: Path,
) -> None:
    """Triton's L0_model_config control_tensor_no_value: reading the values by position
    used to raise IndexError while checking the model file."""
    add_model(tmp_path)
    (tmp_path / "digits" / "config.pbtxt").write_text(
        'sequence_batching { control_input [{ name: "READY" control [{ kind: '
        "CONTROL_SEQUENCE_READY }] }] }"
    )
    assert problems(tmp_path) == (
        "digits/config.pbtxt: sequence batching must specify either 'int32_false_true', "
        "'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_READY for digits",
    )


@pytest.mark.parametrize(
    ("entries", "batch"),
    [
        ((), 32),
        (("default-max-batch-size=4",), 4),  # Triton's backends' default
        (("default-max-batch-size=4", "onnxruntime,default-max-batch-size=8"), 8),
        (("tensorrt,default-max-batch-size=2",), 32),  # another backend's
        (("onnxruntime,default-max-batch-size=0",), 0),  # no batching, as in Triton
    ],
)
def test_backend_config_sets_the_batch_size_of_a_completed_config(
    tmp_path: Path, entries: tuple[str, ...], batch: int
) -> None:
    """Triton's --backend-config default-max-batch-size: for every backend or for one."""
    add_model(tmp_path)
    repository = ModelRepository(tmp_path, backend_config=parse_backend_config(entries))
    config = repository.resolve("digits").config
    assert config.max_batch_size == batch
    assert config.HasField("dynamic_batching") is (batch > 0)


# --- Triton's L0_model_config autofill_noplatform/onnx cases, in its backend's words ---------


TWO_INPUTS = (("INPUT0", FP32, [-1, 16]), ("INPUT1", FP32, [-1, 16]))
ONE_OUTPUT = (("OUTPUT0", FP32, [-1, 16]),)


def _tensors(kind: str, names: tuple[str, ...]) -> str:
    return " ".join(f'{kind} [{{ name: "{n}" data_type: TYPE_FP32 dims: [ 16 ] }}]' for n in names)


@pytest.mark.parametrize(
    ("listed", "count"),
    [
        (("INPUT1",), "configuration expects 1 inputs, model provides 2"),
        (("INPUT0", "INPUT1", "INPUT_EXTRA"), "configuration expects 3 inputs, model provides 2"),
    ],
)
def test_a_config_listing_too_few_or_too_many_inputs_is_refused_by_count_first(
    tmp_path: Path, listed: tuple[str, ...], count: str
) -> None:
    """L0_model_config too_few_inputs and too_many_inputs: the ONNX Runtime backend's count
    check, then batchserve's account of which names differ."""
    write_model(tmp_path / "m" / "1" / "model.onnx", build_model(TWO_INPUTS, ONE_OUTPUT))
    (tmp_path / "m" / "config.pbtxt").write_text(
        "max_batch_size: 1 " + _tensors("input", listed) + " " + _tensors("output", ("OUTPUT0",))
    )
    found = problems(tmp_path, "m")
    assert found[0] == f"m/config.pbtxt: unable to load model 'm', {count} (m/1/model.onnx)"
    assert len(found) == 2  # and which name


@pytest.mark.parametrize("auto_complete", [True, False])
def test_batching_a_model_without_a_batch_axis_is_refused_as_tritons_autofill_says(
    tmp_path: Path, auto_complete: bool
) -> None:
    """L0_model_config bad_max_batch_size: the ONNX Runtime backend's auto-complete refuses
    a max_batch_size for a model none of whose tensors has a free leading axis."""
    fixed = tuple((name, FP32, [16]) for name, _, _ in TWO_INPUTS)
    write_model(tmp_path / "m" / "1" / "model.onnx", build_model(fixed, (("OUTPUT0", FP32, [16]),)))
    (tmp_path / "m" / "config.pbtxt").write_text(
        "max_batch_size: 1 " + _tensors("input", ("INPUT0", "INPUT1"))
        + " " + _tensors("output", ("OUTPUT0",))
    )  # fmt: skip
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(tmp_path, auto_complete=auto_complete).resolve("m")
    autofill = (
        "m/config.pbtxt: autofill failed for model 'm': model does not support batching while "
        "non-zero max_batch_size is specified (m/1/model.onnx)"
    )
    assert (autofill in caught.value.problems) is auto_complete, caught.value.problems
    assert any("needs a leading dynamic batch axis" in p for p in caught.value.problems)


def test_with_completion_off_a_missing_data_type_is_said_whatever_the_platform(
    tmp_path: Path,
) -> None:
    """L0_model_config noautofill_platform/missing_datatype with platform pytorch_libtorch:
    the config's own gap is said beside the platform batchserve lacks."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(
        'name: "m" platform: "pytorch_libtorch" max_batch_size: 1 '
        'input [{ name: "input" dims: [ 16 ] }] '
        'output [{ name: "output" data_type: TYPE_FP32 dims: [ 16 ] }]'
    )
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(tmp_path, auto_complete=False).resolve("m")
    found = caught.value.problems
    assert any("field 'platform' is 'pytorch_libtorch'" in p for p in found), found
    assert any("model input 'input' must specify 'data_type' for m" in p for p in found), found
