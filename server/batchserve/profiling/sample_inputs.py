"""The sample each request carries, for load generators: perf_analyzer's ``--input-data``
and ``--shape``, and the same values fed to ONNX Runtime in-process.

perf_analyzer's own random data cannot drive every model: an input with free axes needs a
shape, random 64-bit integers are no valid token ids (nor a count of responses or a delay
anyone waits for), and random strings no prompt. One sample per input is built from the
model's (completed) config: the values given where the caller knows realistic ones, the true
length for the ``batchserve { sequence_length_input }``, small positive integers (valid ids
for any vocabulary of 10 or more) for other integer inputs, N(0, 1) for floats, a short line
of lowercase ASCII for strings; free axes are the given shape or 32. An optional input is left
out unless the caller names it, as a client that does not set it would: the model's default
holds. A sequence model's sample is sent as sequences of ``SEQUENCE_STEPS`` requests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.core.datatypes import DataType, from_config
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInput

DEFAULT_AXIS = 32
INT_LOW, INT_HIGH = 1, 9
STRING_LENGTH = 16
STRING_LETTERS = "abcdefghijklmnopqrstuvwxyz "
SEQUENCE_STEPS = 20
"""Requests a sequence: perf_analyzer's own default sequence length."""


class UnsupportedInput(ValueError):
    """An input whose values cannot be generated (BF16, which JSON cannot carry): the load
    generator's own data must do."""


@dataclass(frozen=True)
class Sample:
    """One input's value for a single request (no batch axis)."""

    name: str
    datatype: DataType
    array: npt.NDArray[Any]
    free_axes: bool  # the config leaves an axis free: perf_analyzer needs --shape


@dataclass(frozen=True)
class ModelInputs:
    model: str
    batched: bool
    samples: tuple[Sample, ...]
    notes: tuple[str, ...] = ()
    steps: int = 1
    """Requests a stream holds: ``SEQUENCE_STEPS`` for a sequence model, else one."""

    def feeds(self, batch: int) -> dict[str, npt.NDArray[Any]]:
        """The sample repeated ``batch`` times, as ONNX Runtime takes it."""
        if not self.batched:
            return {s.name: s.array for s in self.samples}
        return {s.name: np.repeat(s.array[None], batch, axis=0) for s in self.samples}

    def pa_data(self) -> dict[str, Any]:
        """perf_analyzer's ``--input-data`` JSON: one step holding every input, or for a
        sequence model one stream of ``steps`` such steps (perf_analyzer then sends sequences
        of that length)."""
        step = {
            s.name: {"content": s.array.ravel().tolist(), "shape": list(s.array.shape)}
            for s in self.samples
        }
        return {"data": [[step] * self.steps if self.steps > 1 else step]}

    def pa_args(self, work: Path) -> list[str]:
        """``--shape`` for free axes and ``--input-data`` (written into ``work``)."""
        data = work / f"input-{self.model}.json"
        data.write_text(json.dumps(self.pa_data()))
        args = ["--input-data", str(data)]
        for s in self.samples:
            if s.free_axes:
                args += ["--shape", shape_flag(s.name, s.array.shape)]
        return args


def shape_flag(name: str, dims: tuple[int, ...]) -> str:
    """``NAME:D1,D2``, as perf_analyzer's --shape takes it (``parse_shape`` reads it)."""
    return f"{name}:{','.join(map(str, dims))}"


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME:D1,D2`` (perf_analyzer's --shape: one sample's dims) into name and dims."""
    name, sep, dims = text.rpartition(":")
    try:
        sizes = tuple(int(d) for d in dims.split(","))
    except ValueError:
        sizes = ()
    if not (sep and name and sizes) or min(sizes) < 1:
        raise ValueError(f"--shape {text!r}: expected NAME:D1[,D2...] with positive sizes")
    return name, sizes


def plan(
    model: str,
    config: ModelConfig,
    shapes: Mapping[str, tuple[int, ...]],
    seed: int = 0,
    known: Mapping[str, Any] | None = None,
) -> ModelInputs:
    """The sample of each input of ``model``; ``shapes`` sets free axes (else 32, noted);
    ``known`` gives realistic values by input name, as one step of perf_analyzer's
    ``--input-data`` holds them. Optional inputs are sent only when ``shapes`` or ``known``
    names them."""
    rng = np.random.default_rng(seed)
    known = known or {}
    length_input = config.batchserve.sequence_length_input
    sent = [t for t in config.input if not t.optional or t.name in shapes or t.name in known]
    dims = {t.name: _dims(model, t, shapes) for t in sent}
    seq = next((d[1] for n, d in dims.items() if d[1] and n != length_input), DEFAULT_AXIS)
    samples, notes = [], []
    left_out = [t.name for t in config.input if t not in sent]
    if left_out:
        notes.append(f"{model}: optional inputs left out, the model's defaults hold: "
                     f"{', '.join(left_out)}")  # fmt: skip
    for tensor in sent:
        shape, free = dims[tensor.name]
        datatype = _datatype(model, tensor)
        if free and tensor.name not in shapes:
            notes.append(
                f"{model}: free axes of '{tensor.name}' set to {DEFAULT_AXIS} "
                "(--shape NAME:DIMS sets them)"
            )
        if tensor.name in known:
            array = _known(known[tensor.name], datatype, shape)
        elif tensor.name == length_input:
            array = np.full(shape, seq, dtype=datatype.numpy)
        else:
            array = _random(rng, datatype, shape)
        samples.append(Sample(tensor.name, datatype, array, bool(free)))
    steps = SEQUENCE_STEPS if config.HasField("sequence_batching") else 1
    return ModelInputs(model, config.max_batch_size > 0, tuple(samples), tuple(notes), steps)


def _dims(
    model: str, tensor: ModelInput, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[tuple[int, ...], int]:
    """One sample's shape and the size given to its free axes (0 when it has none)."""
    declared = tuple(tensor.dims)
    if -1 not in declared:
        return declared, 0
    given = shapes.get(tensor.name)
    if given is None:
        return tuple(DEFAULT_AXIS if d == -1 else d for d in declared), DEFAULT_AXIS
    fits = len(given) == len(declared) and all(
        d in (-1, g) for d, g in zip(declared, given, strict=True)
    )
    if not fits:
        raise ValueError(f"--shape {tensor.name}: {list(given)} does not fit {model}'s {declared}")
    return given, next(g for d, g in zip(declared, given, strict=True) if d == -1)


def _datatype(model: str, tensor: ModelInput) -> DataType:
    datatype = from_config(tensor.data_type)
    if datatype.wire == "BF16":
        raise UnsupportedInput(
            f"{model}: input '{tensor.name}' is BF16, which perf_analyzer's JSON cannot carry"
        )
    return datatype


def _known(entry: Any, datatype: DataType, shape: tuple[int, ...]) -> npt.NDArray[Any]:
    content = entry["content"] if isinstance(entry, dict) else entry
    given = entry.get("shape", shape) if isinstance(entry, dict) else shape
    return np.asarray(content, dtype=datatype.numpy).reshape(given)


def _random(
    rng: np.random.Generator, datatype: DataType, shape: tuple[int, ...]
) -> npt.NDArray[Any]:
    if datatype.wire == "BYTES":
        letters = rng.choice(list(STRING_LETTERS), (*shape, STRING_LENGTH))
        return np.array(["".join(row) for row in letters.reshape(-1, STRING_LENGTH)],
                        dtype=object).reshape(shape)  # fmt: skip
    kind = datatype.numpy.kind
    if kind == "f":
        return rng.standard_normal(shape).astype(datatype.numpy)
    if kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(INT_LOW, INT_HIGH + 1, shape).astype(datatype.numpy)
