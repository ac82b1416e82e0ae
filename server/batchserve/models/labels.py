"""Class labels of a model's outputs, read once when the model is resolved.

An output's ``label_filename`` in config.pbtxt names a file relative to the model's
directory, one label per line, as Triton reads it (core ``src/model.cc``,
``src/label_provider.cc``): lines split at ``\\n`` only, a last line without a newline still
counts. A file that is missing, unreadable, too large, or outside the model's directory
(after symlinks) fails the model with a message naming the file and the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Final

from batchserve.core.repository_files import UnusableFile, follow_links, read_regular_file
from batchserve.proto.model_config_pb2 import ModelOutput

MAX_LABEL_FILE_BYTES: Final = 64 << 20
"""Larger label files are refused: millions of classes is not a label file."""

LabelMap = dict[str, tuple[bytes, ...]]


def read_labels(
    outputs: Iterable[ModelOutput], model_dir: Path, *, source: str
) -> tuple[LabelMap, list[str]]:
    """Each output's labels (outputs without a label file are absent), and the problems."""
    labels: LabelMap = {}
    problems: list[str] = []
    for output in outputs:
        if not output.label_filename:
            continue
        field = f"{source}: output '{output.name}': label_filename '{output.label_filename}'"
        try:
            labels[output.name] = _read(model_dir, output.label_filename)
        except _LabelFileError as exc:
            problems.append(f"{field}: {exc}")
    return labels, problems


class _LabelFileError(Exception):
    """Why one label file cannot be used."""


def _read(model_dir: Path, filename: str) -> tuple[bytes, ...]:
    try:
        root = follow_links(model_dir)
        path = follow_links(model_dir / filename)
    except UnusableFile as exc:
        raise _LabelFileError(str(exc)) from None
    if not path.is_relative_to(root) or path == root:
        raise _LabelFileError("is outside the model directory")
    if not path.is_file():
        raise _LabelFileError("does not exist or is not a file")
    try:
        data = read_regular_file(path, MAX_LABEL_FILE_BYTES, "a label file")
    except UnusableFile as exc:
        raise _LabelFileError(str(exc)) from None
    lines = data.split(b"\n")
    if lines[-1] == b"":  # the newline ending the last line starts no new one
        lines.pop()
    return tuple(lines)
