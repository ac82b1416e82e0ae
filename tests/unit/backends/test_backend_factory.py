from pathlib import Path

import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.backends.selection import (
    FORMATS,
    ModelFormat,
    create_backend,
    format_from_config,
    format_from_filename,
    runtime_name,
)
from batchserve.backends.tensorrt import TensorRTBackend
from batchserve.core.errors import ModelConfigError
from batchserve.proto.model_config_pb2 import ModelConfig


@pytest.mark.parametrize(
    ("backend", "platform", "filename", "expected"),
    [
        ("", "", "model.onnx", "onnxruntime"),
        ("", "", "model.plan", "tensorrt"),
        ("onnxruntime", "", "model.onnx", "onnxruntime"),
        ("", "onnxruntime_onnx", "model.bin", "onnxruntime"),
        ("tensorrt", "", "model.engine", "tensorrt"),
        ("", "tensorrt_plan", "model.plan", "tensorrt"),
        ("tensorrt", "tensorrt_plan", "model.plan", "tensorrt"),
    ],
)
def test_runtime_is_chosen_by_backend_platform_or_suffix(
    backend: str, platform: str, filename: str, expected: str
):
    config = ModelConfig(backend=backend, platform=platform)
    assert runtime_name(config, Path(filename)) == expected


def test_create_backend_returns_an_unloaded_backend_of_the_right_kind(mlp_file: Path):
    assert isinstance(create_backend(ModelConfig(), mlp_file), OnnxBackend)
    assert isinstance(create_backend(ModelConfig(), Path("model.plan")), TensorRTBackend)


def test_memory_limit_reaches_the_onnx_backend(mlp_file: Path):
    backend = create_backend(ModelConfig(name="m"), mlp_file, memory_limit_bytes=1)
    with pytest.raises(ModelConfigError, match="memory limit 1 bytes"):
        backend.load(mlp_file, ModelConfig(name="m"), backend.device)


@pytest.mark.parametrize(
    ("config", "filename", "match"),
    [
        (
            ModelConfig(platform="pytorch_libtorch"),
            "model.pt",
            "field 'platform' is 'pytorch_libtorch'",
        ),
        (
            ModelConfig(backend="python"),
            "model.py",
            "field 'backend' is 'python': batchserve does not support",
        ),
        (ModelConfig(), "model.pt", "cannot tell which runtime"),
        (
            ModelConfig(backend="tensorrt", platform="onnxruntime_onnx"),
            "model.plan",
            "disagree",
        ),
        (ModelConfig(platform="tensorrt_plan"), "model.onnx", "asks for tensorrt.*\\.onnx"),
    ],
)
def test_unsupported_or_contradictory_choices_are_config_errors(
    config: ModelConfig, filename: str, match: str
):
    with pytest.raises(ModelConfigError, match=f"{filename}: .*{match}"):
        create_backend(config, Path(filename))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda fmt: fmt.backend)
def test_the_one_table_names_each_runtime_for_the_repository_and_the_factory(fmt: ModelFormat):
    model_file = Path(fmt.default_filename)
    for config in (ModelConfig(platform=fmt.platform), ModelConfig(backend=fmt.backend)):
        assert format_from_config(config, source="m/config.pbtxt") is fmt
        assert runtime_name(config, model_file) == fmt.backend
    assert format_from_filename(model_file.name) is fmt
    assert runtime_name(ModelConfig(), model_file) == fmt.backend


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(platform="ensemble"),
        ModelConfig(backend="python"),
        ModelConfig(platform="onnxruntime_onnx", backend="tensorrt"),
    ],
    ids=["ensemble", "unknown backend", "contradiction"],
)
def test_the_repository_and_the_factory_refuse_a_config_in_the_same_words(config: ModelConfig):
    with pytest.raises(ModelConfigError) as by_repository:
        format_from_config(config, source="m/1/model.onnx")
    with pytest.raises(ModelConfigError) as by_factory:
        runtime_name(config, Path("m/1/model.onnx"))
    assert by_factory.value.message == by_repository.value.message
