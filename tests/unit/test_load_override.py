"""Triton's load parameters: what is accepted, what is refused and with which words."""

from __future__ import annotations

import base64
import os
from pathlib import Path, PurePosixPath

import pytest
from batchserve.core.errors import Internal, InvalidArgument, PayloadTooLarge
from batchserve.models.load_override import (
    OverrideDirectory,
    parse_load_parameters,
    parse_unload_parameters,
)

CONFIG = '{"max_batch_size": 16}'


def _parse(parameters: dict[str, object], base64_files: bool = False) -> object:
    return parse_load_parameters(parameters, files_in_base64=base64_files, max_total_bytes=1000)


def test_no_parameters_is_no_override() -> None:
    assert _parse({}) is None


def test_config_is_a_json_model_config() -> None:
    override = parse_load_parameters({"config": CONFIG}, files_in_base64=False, max_total_bytes=10)
    assert override is not None
    assert override.config is not None
    assert override.config.max_batch_size == 16
    assert override.files == {}


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ('"parameters": {"config": {{"max_batch_size": "16"}}}', "Invalid config override"),
        ('{"max_batch_size": "many"}', "max_batch_size"),
        ('{"no_such_field": 1}', "no_such_field"),
        ("[" * 100_000, "Invalid config override"),
    ],
)
def test_a_malformed_config_is_refused_naming_it(config: str, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words) as error:
        _parse({"config": config})
    assert "parameter 'config'" in error.value.message


def test_config_must_be_a_string() -> None:
    with pytest.raises(InvalidArgument, match="'config' must have string type"):
        _parse({"config": b"{}"})


def test_files_need_config_as_triton_requires() -> None:
    with pytest.raises(InvalidArgument, match="'config' must be specified for model file"):
        _parse({"file:1/model.onnx": b"x"})


def test_files_over_http_are_base64_and_over_grpc_bytes() -> None:
    encoded = base64.b64encode(b"\x00model").decode()
    http = parse_load_parameters(
        {"config": "{}", "file:1/model.onnx": encoded}, files_in_base64=True, max_total_bytes=99
    )
    grpc = parse_load_parameters(
        {"config": "{}", "file:1/model.onnx": b"\x00model"},
        files_in_base64=False,
        max_total_bytes=99,
    )
    assert http is not None
    assert grpc is not None
    assert http.files == grpc.files == {PurePosixPath("1/model.onnx"): b"\x00model"}


@pytest.mark.parametrize(
    ("value", "base64_files", "words"),
    [
        ("not base64!", True, "is not valid base64"),
        (b"bytes", True, "must be a base64 string, got bytes"),
        ("text", False, "must have bytes type"),
    ],
)
def test_file_content_of_the_wrong_kind_is_refused(
    value: object, base64_files: bool, words: str
) -> None:
    with pytest.raises(InvalidArgument, match=words) as error:
        _parse({"config": "{}", "file:1/model.onnx": value}, base64_files)
    assert "'file:1/model.onnx'" in error.value.message


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("../outside", "'..' component"),
        ("1/../../outside", "'..' component"),
        ("1/./model.onnx", "'.' component"),
        ("1//model.onnx", "'empty' component"),
        ("1\\model.onnx", "backslash"),
        ("1/model\x00.onnx", "control character"),
        ("/".join("d" * 9), "levels deep"),
        ("config.pbtxt", "comes from parameter 'config'"),
    ],
)
def test_paths_that_could_leave_the_model_directory_are_refused(path: str, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words) as error:
        _parse({"config": "{}", f"file:{path}": b"x"})
    assert error.value.message.startswith("Invalid file parameter 'file:")


def test_a_component_over_name_max_is_triton_s_internal_error() -> None:
    """Triton answers INTERNAL here and its model-control example checks that status."""
    with pytest.raises(Internal, match="longer than 255 bytes"):
        _parse({"config": "{}", "file:" + "A" * 256: b"a"})


def test_a_file_that_is_also_a_directory_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="directory has been created as a file"):
        _parse({"config": "{}", "file:1": b"x", "file:1/model.onnx": b"y"})


def test_the_total_size_is_bounded() -> None:
    with pytest.raises(PayloadTooLarge, match="over 1000 bytes"):
        _parse({"config": "{}", "file:1/a": b"x" * 600, "file:1/b": b"x" * 600})


def test_unknown_parameters_are_refused_with_triton_s_words() -> None:
    with pytest.raises(
        InvalidArgument, match="Unrecognized load parameter 'speed' with type 'int'"
    ):
        _parse({"speed": 3})


def test_the_override_directory_is_private_and_removed(tmp_path: Path) -> None:
    files = {PurePosixPath("1/model.onnx"): b"onnx", PurePosixPath("1/data/weights"): b"w"}
    directory = OverrideDirectory("m", files)
    try:
        assert (directory.root / "m/1/model.onnx").read_bytes() == b"onnx"
        assert (directory.root / "m/1/data/weights").read_bytes() == b"w"
        assert os.stat(directory.root).st_mode & 0o077 == 0
    finally:
        directory.remove()
    assert not directory.root.exists()


def test_unload_dependents_is_accepted_and_checked() -> None:
    assert parse_unload_parameters({}) is False
    assert parse_unload_parameters({"unload_dependents": True}) is True
    with pytest.raises(InvalidArgument, match="Unable to parse 'unload_dependents'"):
        parse_unload_parameters({"unload_dependents": "yes"})
    with pytest.raises(InvalidArgument, match="Unrecognized unload parameter 'force'"):
        parse_unload_parameters({"force": True})
