"""Triton's ``identity`` backend: each output ``OUTPUT<i>`` is a copy of input ``INPUT<i>``.

Triton ships it for testing, and its own test suites, its perf_analyzer examples and many
users' first model repositories are built on it: a model with no file, whose cost is request
handling and batching alone. Here it is a runtime like the others, run by the same batcher
and instances (dynamic batching, instance counts, priorities and statistics all hold), so a
repository written for Triton's identity backend is served as written.

Its config parameters, as Triton's backend reads them:

- ``execute_delay_ms``: each execution (one batch) sleeps this long first;
- ``instance_wise_delay_multiplier``: with it, instance *i* (the model's instances counted
  from 0 in the config's order) sleeps ``execute_delay_ms`` times ``multiplier * i``, at
  least once: Triton's tests make one instance slower than another with it;
- ``creation_delay_sec``: each instance's load sleeps this long first (Triton's sleeps
  once per model).

An ``optional`` input a request leaves out gives zeros for its output, shaped by the
config's dims (free axes 1), as Triton's backend does; here with the batch axis in front
when the model batches, so that each request of the batch gets its row.

Like Triton's, it counts the bytes of the inputs it is given in its own metric family,
``input_byte_size_counter`` (``backend_counters``, served on the metrics port per model
version), and every response carries its four example parameters
(``core/response_parameters.py``).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import numpy as np

from batchserve.backends.base import Arrays
from batchserve.core.datatypes import config_name, from_config
from batchserve.core.device import CPU, Device
from batchserve.core.errors import BackendError
from batchserve.core.signature import DYNAMIC, ModelSignature, TensorSpec
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInput, ModelOutput

EXECUTE_DELAY = "execute_delay_ms"
CREATION_DELAY = "creation_delay_sec"
DELAY_MULTIPLIER = "instance_wise_delay_multiplier"
_INDEX = re.compile(r"(INPUT|OUTPUT)(\d+)$")


def identity_problems(config: ModelConfig) -> list[str]:
    """What Triton's identity backend refuses in a config (its ``ValidateModelConfig``),
    in its words: inputs and outputs in pairs, named ``INPUT<i>``/``OUTPUT<i>``, each pair of
    one datatype and one shape (``reshape`` where given, else ``dims``); and its parameters
    as integers."""
    problems = [
        f"parameter '{key}' must be an integer, got '{value}'"
        for key in (EXECUTE_DELAY, CREATION_DELAY, DELAY_MULTIPLIER)
        if (value := _parameter(config, key)) and _integer(value) is None
    ]
    if len(config.input) != len(config.output):
        return [*problems, "model configuration must have equal input/output pairs"]
    return problems + _pair_problems(config)[:1]


def _pair_problems(config: ModelConfig) -> list[str]:
    """Each pair's problems in the order Triton's backend checks them (it stops at the
    first): the names pair by pair, then each output against its input."""
    found: dict[str, dict[int, tuple[int, tuple[int, ...]]]] = {"input": {}, "output": {}}
    problems = []
    for pair in zip(config.input, config.output, strict=True):
        tensors: tuple[tuple[str, ModelInput | ModelOutput], ...] = (
            ("input", pair[0]),
            ("output", pair[1]),
        )
        for kind, tensor in tensors:
            match = _INDEX.match(tensor.name)
            if match is None or match.group(1) != kind.upper():
                problems.append(
                    f"expected {kind} name to follow {kind.upper()}<index> pattern, got "
                    f"'{tensor.name}'"
                )
            else:
                found[kind][int(match.group(2))] = (tensor.data_type, _shape(tensor))
    for index, (datatype, shape) in found["output"].items():
        paired = found["input"].get(index)
        if paired is None:
            problems.append("expected input and output indices to match")
        elif paired[0] != datatype:
            problems.append(
                "expected input and output datatype to match, got "
                f"{config_name(paired[0])} and {config_name(datatype)}"
            )
        elif paired[1] != shape:
            problems.append(
                f"expected input and output shape to match, got {_text(paired[1])} and "
                f"{_text(shape)}"
            )
    return problems


def _index(name: str) -> int:
    """The pair a checked tensor name belongs to (``INPUT01`` and ``OUTPUT1`` pair, as in
    Triton's backend, which reads the digits as a number)."""
    match = _INDEX.match(name)
    assert match is not None  # identity_problems checked it
    return int(match.group(2))


def _sample_bytes(tensor: ModelOutput) -> int:
    """A sample's bytes of ``tensor``: its free axes taken as 1, a string element as the
    pointer numpy holds for it."""
    size = from_config(tensor.data_type).itemsize or np.dtype(object).itemsize
    return size * math.prod(max(dim, 1) for dim in _shape(tensor))


def _shape(tensor: ModelInput | ModelOutput) -> tuple[int, ...]:
    return tuple(tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims)


def _text(shape: tuple[int, ...]) -> str:
    """A shape as Triton's ``ShapeToString`` writes it: ``[1,-1]``."""
    return "[" + ",".join(str(dim) for dim in shape) + "]"


def _parameter(config: ModelConfig, key: str) -> str:
    return config.parameters[key].string_value if key in config.parameters else ""


def _integer(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _seconds(config: ModelConfig, key: str, scale: float) -> float:
    """A delay parameter, times ``scale`` its unit in seconds (0 when unset)."""
    value = _integer(_parameter(config, key)) or 0
    return max(0, value) * scale


def config_signature(config: ModelConfig) -> ModelSignature:
    """The tensors as the config declares them: the identity backend has no file to read
    them from (the batch axis in front, free, when the model batches)."""
    batch = (DYNAMIC,) if config.max_batch_size > 0 else ()

    def spec(tensor: ModelInput | ModelOutput) -> TensorSpec:
        return TensorSpec(tensor.name, from_config(tensor.data_type), batch + _shape(tensor))

    return ModelSignature(
        tuple(spec(t) for t in config.input), tuple(spec(t) for t in config.output)
    )


INPUT_BYTES_FAMILY: Final = "input_byte_size_counter"
INPUT_BYTES_HELP: Final = "Cumulative input byte size of all requests received by the model"


def _byte_size(array: np.ndarray) -> int:
    """Bytes as Triton counts an input's: BYTES elements as serialized (a 4-byte length,
    then the bytes)."""
    if array.dtype.kind != "O":
        return int(array.nbytes)
    return 4 * array.size + sum(map(len, array.flat))


class IdentityBackend:
    """One identity instance: outputs copied from inputs, on the host whatever the device
    (Triton's backend copies through host memory too)."""

    def __init__(self) -> None:
        self._device: Device = CPU
        self._signature = ModelSignature((), ())
        self._delay_s = 0.0
        self._batched = False
        self._missing: dict[str, tuple[np.dtype[np.generic], tuple[int, ...]]] = {}
        """For each optional input: its dtype and a request's shape (free axes as 1)."""
        self._pairs: dict[str, str] = {}
        self._per_sample = 0
        self._input_bytes = 0
        self._ordinal = 0

    def number_instance(self, ordinal: int) -> None:
        """This instance's place among its model's, counted from 0 (before ``load``)."""
        self._ordinal = ordinal

    @property
    def device(self) -> Device:
        return self._device

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    def load(self, model_file: Path, config: ModelConfig, device: Device) -> None:
        problems = identity_problems(config)
        if problems:
            raise BackendError(f"{config.name}: {problems[0]}")
        time.sleep(_seconds(config, CREATION_DELAY, 1.0))
        self._device = device
        self._signature = config_signature(config)
        multiplier = max(0, _integer(_parameter(config, DELAY_MULTIPLIER)) or 0)
        self._delay_s = _seconds(config, EXECUTE_DELAY, 1e-3) * max(multiplier * self._ordinal, 1)
        self._batched = config.max_batch_size > 0
        self._per_sample = sum(_sample_bytes(t) for t in config.output)
        inputs = {_index(t.name): t.name for t in config.input}
        self._pairs = {t.name: inputs[_index(t.name)] for t in config.output}
        self._missing = {
            t.name: (from_config(t.data_type).numpy, tuple(max(d, 1) for d in _shape(t)))
            for t in config.input
            if t.optional
        }

    def infer(
        self, inputs: Arrays, output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        if self._delay_s:
            time.sleep(self._delay_s)
        self._input_bytes += sum(_byte_size(array) for array in inputs.values())
        names = list(self._pairs) if output_names is None else output_names
        rows = next(iter(inputs.values())).shape[0] if self._batched and inputs else 1
        outputs = {}
        for name in names:
            source = self._pairs[name]
            array = inputs.get(source)
            if array is not None:
                outputs[name] = array.copy()
            else:  # an optional input left out: zeros, as Triton's backend gives
                dtype, shape = self._missing[source]
                full = (rows, *shape) if self._batched else shape
                outputs[name] = np.full(full, b"" if dtype.kind == "O" else 0, dtype)
        return outputs

    def declared_memory(self) -> tuple[int, int]:
        """(fixed, per sample) bytes: nothing between runs, and a run's output copies; the
        load takes it instead of probing (``memory_probe.declared_profile``)."""
        return 0, self._per_sample

    def declared_run_ns(self) -> int:
        """How long a run takes whatever its size: its delay (0 without one, a copy)."""
        return int(self._delay_s * 1e9)

    def backend_counters(self) -> list[tuple[str, str, int]]:
        """Its own metric family as Triton's backend registers it: (name, help, value)."""
        return [(INPUT_BYTES_FAMILY, INPUT_BYTES_HELP, self._input_bytes)]

    def memory_bytes(self) -> int | None:
        return 0  # it holds nothing between runs

    def release_after_next_run(self) -> None:
        pass

    def interrupt(self) -> None:
        pass  # a run is a copy (and its delay): nothing to stop

    def unload(self) -> None:
        self._pairs = {}
