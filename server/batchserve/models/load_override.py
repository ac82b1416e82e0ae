"""Triton's load parameters: a ``config`` override and ``file:<path>`` model files.

``config`` is a JSON ModelConfig used instead of the repository's config.pbtxt for that
load; ``file:<path>`` parameters make up the whole model directory for that load, written
to a private temporary directory (Triton requires ``config`` along with them). Every name,
path and size comes from the client, so each is checked and bounded here.
"""

from __future__ import annotations

import base64
import binascii
import os
import shutil
import tempfile
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from google.protobuf import json_format

from batchserve.core.errors import InternalRefusal, InvalidArgument, PayloadTooLarge
from batchserve.models.model_config import CONFIG_FILENAME
from batchserve.proto.model_config_pb2 import ModelConfig

FILE_PREFIX = "file:"
MAX_FILES = 256
MAX_PATH_BYTES = 1024
MAX_DEPTH = 8
MAX_COMPONENT_BYTES = 255

# A parameter's value as an adapter hands it over: whatever JSON held, or the oneof a
# gRPC ModelRepositoryParameter carries; checked here, never trusted.
ParameterValue = object


class NameTooLong(InternalRefusal):
    """A path component over the file system's NAME_MAX. Triton answers INTERNAL ("failed
    to poll from model repository") here, and its own model-control example checks that
    status, so batchserve answers the same; the message still names the parameter."""


@dataclass(frozen=True, slots=True)
class LoadOverride:
    """What a load request asks to use instead of the repository's files."""

    config: ModelConfig | None = None
    files: dict[PurePosixPath, bytes] = field(default_factory=dict)


def _kind(value: ParameterValue) -> str:
    names = {str: "string", bytes: "bytes", bool: "bool", int: "int", float: "float"}
    return names.get(type(value), "null" if value is None else type(value).__name__)


def parse_load_parameters(
    parameters: Mapping[str, ParameterValue], *, files_in_base64: bool, max_total_bytes: int
) -> LoadOverride | None:
    """The override a load asks for; None when it asks for none.

    ``files_in_base64``: the HTTP protocol sends file content as base64 strings, gRPC as
    bytes. Raises InvalidArgument naming the parameter that is wrong.
    """
    if not parameters:
        return None
    config: ModelConfig | None = None
    files: dict[PurePosixPath, bytes] = {}
    total = 0
    for name, value in parameters.items():
        if name == "config":
            config = _config(value)
        elif name.startswith(FILE_PREFIX):
            content = _file_content(name, value, files_in_base64)
            total += len(content)
            if total > max_total_bytes:
                raise PayloadTooLarge(
                    f"load parameters: the files are over {max_total_bytes} bytes in all"
                )
            files[_relative_path(name)] = content
        else:
            raise InvalidArgument(
                f"Unrecognized load parameter '{name[:64]}' with type '{_kind(value)}'; "
                "batchserve knows 'config' and 'file:<path>'"
            )
    if len(files) > MAX_FILES:
        raise InvalidArgument(f"load parameters: more than {MAX_FILES} files")
    if files and config is None:
        raise InvalidArgument("Load parameter 'config' must be specified for model file override")
    _check_tree(files)
    return LoadOverride(config, files)


def _config(value: ParameterValue) -> ModelConfig:
    if not isinstance(value, str):
        raise InvalidArgument("Config parameter 'config' must have string type for its value")
    try:
        return json_format.Parse(value, ModelConfig())
    except (json_format.ParseError, ValueError, RecursionError) as exc:
        raise InvalidArgument(f"Invalid config override: parameter 'config': {exc}") from None


def _file_content(name: str, value: ParameterValue, base64_text: bool) -> bytes:
    label = name[:128]
    if base64_text:
        if not isinstance(value, str):
            raise InvalidArgument(
                f"File parameter '{label}' must be a base64 string, got {_kind(value)}"
            )
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument(f"File parameter '{label}' is not valid base64") from None
    if not isinstance(value, bytes):
        raise InvalidArgument(f"File parameter '{label}' must have bytes type for its value")
    return value


def _relative_path(name: str) -> PurePosixPath:
    """The path after ``file:``: relative, plain components, nothing that leaves the dir."""
    text = name[len(FILE_PREFIX) :]
    label = name[:128]
    if any(len(p.encode("utf-8", errors="replace")) > MAX_COMPONENT_BYTES for p in text.split("/")):
        raise NameTooLong(
            f"Invalid file parameter '{label}': a path component is longer than "
            f"{MAX_COMPONENT_BYTES} bytes (the file system's NAME_MAX)"
        )
    problem = _path_problem(text)
    if problem is not None:
        raise InvalidArgument(
            f"Invalid file parameter '{label}': {problem}; the path must stay within the "
            "model directory"
        )
    path = PurePosixPath(text)
    if path == PurePosixPath(CONFIG_FILENAME):
        raise InvalidArgument(
            f"Invalid file parameter '{label}': the model's config comes from parameter 'config'"
        )
    return path


def _path_problem(text: str) -> str | None:
    if not text:
        return "the path is empty"
    if len(text.encode("utf-8", errors="replace")) > MAX_PATH_BYTES:
        return f"the path is longer than {MAX_PATH_BYTES} bytes"
    if text.startswith("/"):
        return "the path is absolute"
    if "\\" in text or any(unicodedata.category(c) == "Cc" for c in text):
        return "the path contains a backslash or a control character"
    parts = text.split("/")
    if len(parts) > MAX_DEPTH:
        return f"the path is more than {MAX_DEPTH} levels deep"
    for part in parts:
        if part in ("", ".", ".."):
            return f"the path has a {part or 'empty'!r} component"
    return None


def _check_tree(files: Mapping[PurePosixPath, bytes]) -> None:
    """No file may also be a directory of another (``1`` and ``1/model.onnx``)."""
    directories = {parent for path in files for parent in path.parents}
    for path in files:
        if path in directories:
            raise InvalidArgument(
                f"Invalid file parameter '{FILE_PREFIX}{path}', directory has been created "
                "as a file"
            )


class OverrideDirectory:
    """A private temporary repository holding one model's override files; removed by
    ``remove`` once the model loaded from it is unloaded or replaced."""

    def __init__(self, model_name: str, files: Mapping[PurePosixPath, bytes]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="batchserve-load-")).resolve()
        try:
            model_dir = self.root / model_name
            model_dir.mkdir(mode=0o700)
            for path, content in files.items():
                _write_new(model_dir, path, content)
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _write_new(model_dir: Path, path: PurePosixPath, content: bytes) -> None:
    """Create the file and its directories; never follow or replace anything present."""
    target = model_dir.joinpath(*path.parts)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not target.parent.resolve().is_relative_to(model_dir):  # pragma: no cover - defensive
        raise InvalidArgument(f"Invalid file parameter '{FILE_PREFIX}{path}'")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(target, flags, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(content)


def parse_unload_parameters(parameters: Mapping[str, ParameterValue]) -> bool:
    """``unload_dependents``, Triton's only unload parameter: whether an ensemble's unload
    also unloads the composing models loaded along with it."""
    dependents = False
    for name, value in parameters.items():
        if name != "unload_dependents":
            raise InvalidArgument(
                f"Unrecognized unload parameter '{name[:64]}'; batchserve knows 'unload_dependents'"
            )
        if not isinstance(value, bool):
            raise InvalidArgument(
                f"Unable to parse 'unload_dependents': expected a boolean, got {_kind(value)}"
            )
        dependents = value
    return dependents
