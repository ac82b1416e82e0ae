"""Tensors a config names by file, read as Triton reads them: a warm-up sample's
``input_data_file`` (``warmup/``) and an implicit state's ``initial_state.data_file``
(``initial_state/``), each in its folder of the model's directory.

The file holds raw little-endian elements, at least as many bytes as the tensor needs (the
rest ignored), or, for TYPE_STRING, 4-byte-length-prefixed strings.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Final

import numpy as np

from batchserve.core.datatypes import DataType
from batchserve.core.errors import BatchserveError, ModelConfigError
from batchserve.core.repository_files import UnusableFile, follow_links, read_regular_file
from batchserve.core.tensors import array_from_bytes

MAX_FILE_BYTES: Final = 256 << 20
"""Largest data file read: the whole file is held in memory."""


def tensor_from_file(
    where: str,
    name: str,
    file: str,
    datatype: DataType,
    shape: tuple[int, ...],
    model_dir: Path,
    *,
    folder: str,
    setting: str,
    field: str,
    file_kind: str,
) -> np.ndarray:
    """The tensor ``<model_dir>/<folder>/<file>`` holds; ModelConfigError naming ``where``
    and the config's ``field`` otherwise (a short file in Triton's words for ``setting``)."""
    try:
        base = follow_links(model_dir / folder)
        path = follow_links(base / file)
        if not path.is_relative_to(base):
            raise ModelConfigError(f"{where}: {field} '{file}' leads outside {folder}/")
        data = read_regular_file(path, MAX_FILE_BYTES, file_kind)
    except UnusableFile as exc:
        raise ModelConfigError(f"{where}: {field} {folder}/{file} {exc}") from None
    if datatype.wire != "BYTES":
        needed = math.prod(shape) * datatype.itemsize
        if len(data) < needed:  # Triton's wording
            raise ModelConfigError(
                f"{where}: {setting} setting expects {needed} bytes, but the data provided "
                f"from {file} only has {len(data)} bytes"
            )
        data = data[:needed]
    try:
        return np.array(array_from_bytes(data, datatype, shape, tensor=name))
    except BatchserveError as exc:
        raise ModelConfigError(f"{where}: {field} '{file}': {exc.message}") from None


def inside_folder(file: str) -> bool:
    """Whether ``file`` names a path inside its folder (not absolute, no ``..``, no NUL)."""
    return not (Path(file).is_absolute() or ".." in Path(file).parts or "\0" in file)
