"""The declared signature of a module to export, and the sizes it is tested at.

``--input tokens:INT64:batch,seq:0..95`` becomes an ``InputSpec``; the whole command line
becomes one ``ExportSpec``, checked when it is built so the exporter never sees a half-valid one.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from batchserve.core.datatypes import BY_WIRE, DataType
from batchserve.core.digits import ascii_digits
from batchserve.core.errors import InvalidArgument
from batchserve.export.image_input import ImageInput

DEFAULT_BATCH_SIZES = (1, 3, 8)
DEFAULT_AXIS_SIZES = (1, 7, 33)
DEFAULT_INT_RANGE = (0, 9)
# Element types that both a torch tensor and an ONNX Runtime numpy input can carry.
EXPORTABLE_TYPES = ("BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


@dataclass(frozen=True, slots=True)
class ValueRange:
    """Inclusive bounds of random test values.

    Args:
        low: smallest value.
        high: largest value, or the name of an axis whose size in each test case is the bound
            (``lengths:INT64:batch,1:1..seq``).
    """

    low: float
    high: float | str

    def bounds(self, sizes: Mapping[str, int]) -> tuple[float, float]:
        """The numeric bounds in one test case."""
        high = sizes[self.high] if isinstance(self.high, str) else self.high
        return self.low, high

    def __str__(self) -> str:
        return f"{self.low}..{self.high}"


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One input of the module's forward, as declared on the command line.

    Args:
        name: the ONNX input's name; forward's parameter of that name, if it has one.
        datatype: element type (one of ``EXPORTABLE_TYPES``).
        dims: fixed sizes (int) and named dynamic axes (str); the batch axis first when batching.
        value_range: bounds of random test values; None means 0..9 for integers, N(0, 1) for floats.
    """

    name: str
    datatype: DataType
    dims: tuple[int | str, ...]
    value_range: ValueRange | None = None

    @property
    def axes(self) -> tuple[str, ...]:
        """Named (dynamic) axes, in order."""
        return tuple(d for d in self.dims if isinstance(d, str))

    def shape(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """Concrete shape for one test case (axis name -> size)."""
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.dims)

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.dims)
        suffix = f":{self.value_range}" if self.value_range else ""
        return f"{self.name}:{self.datatype.wire}:{dims}{suffix}"


@dataclass(frozen=True, slots=True)
class Tolerance:
    """An element passes when ``|got - expected| <= atol + rtol * |expected|``."""

    atol: float = 1e-4
    rtol: float = 1e-3

    def __post_init__(self) -> None:
        for label, value in (("atol", self.atol), ("rtol", self.rtol)):
            if not (math.isfinite(value) and value >= 0):
                raise InvalidArgument(f"--{label} must be a finite number >= 0, not {value}")

    def __str__(self) -> str:
        return f"|got - expected| <= {self.atol:g} + {self.rtol:g} * |expected|"


@dataclass(frozen=True, slots=True)
class ServingOptions:
    """What config.pbtxt says beyond the signature; unset fields keep an existing config's value.

    Args:
        dynamic_batching: write a ``dynamic_batching`` block.
        max_queue_delay_us: its ``max_queue_delay_microseconds``.
        preferred_batch_sizes: its ``preferred_batch_size`` list.
        sequence_length_input: the input carrying each sample's true length (dims [1]).
    """

    dynamic_batching: bool = False
    max_queue_delay_us: int | None = None
    preferred_batch_sizes: tuple[int, ...] = ()
    sequence_length_input: str | None = None


@dataclass(frozen=True, slots=True)
class ExportSpec:
    """Everything that decides what is exported, how it is tested and where it lands.

    Args:
        name: model name (its directory in the repository).
        inputs: forward's inputs, bound to its parameters by name, or else by position.
        outputs: output names; empty means ``output0``, ``output1``, ...
        max_batch_size: 0 exports without a batch axis; otherwise every input's first axis is
            the (named) batch axis.
        version: version directory the model file goes to.
        batch_sizes: batch sizes tested, each clipped to ``max_batch_size``.
        axis_sizes: sizes tested for the other named axes; an axis not listed uses 1, 7, 33.
        tolerance: how close the converted model must be to PyTorch.
        opset: ONNX opset version.
        serving: config.pbtxt options beyond the signature.
        image_input: a UINT8 input the graph itself converts to the module's float NCHW.
    """

    name: str
    inputs: tuple[InputSpec, ...]
    outputs: tuple[str, ...] = ()
    max_batch_size: int = 64
    version: int = 1
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    axis_sizes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    tolerance: Tolerance = Tolerance()
    opset: int = 17
    serving: ServingOptions = ServingOptions()
    image_input: ImageInput | None = None

    def __post_init__(self) -> None:
        _check_scalars(self)
        _check_names(self.inputs, self.outputs)
        _check_sizes(self, _batch_axis(self.inputs, self.max_batch_size))
        _check_ranges(self.inputs)
        _check_serving(self)
        if self.image_input is not None:
            self.image_input.check(self)

    @property
    def batch_axis(self) -> str | None:
        """Name of the batch axis, or None when the model takes no batch."""
        if self.max_batch_size == 0:
            return None
        first = self.inputs[0].dims[0]
        return first if isinstance(first, str) else None

    @property
    def dynamic_axes(self) -> tuple[str, ...]:
        """Named axes other than the batch axis, in the order the inputs declare them."""
        names = dict.fromkeys(axis for spec in self.inputs for axis in spec.axes)
        return tuple(axis for axis in names if axis != self.batch_axis)

    def input(self, name: str) -> InputSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    def sizes_of(self, axis: str) -> tuple[int, ...]:
        """The sizes an axis is tested at."""
        if axis == self.batch_axis:
            return tuple(sorted({min(b, self.max_batch_size) for b in self.batch_sizes}))
        return tuple(sorted(set(self.axis_sizes.get(axis, DEFAULT_AXIS_SIZES))))

    def cases(self) -> tuple[dict[str, int], ...]:
        """Every combination of tested sizes (one case when nothing is dynamic)."""
        axes = self._all_axes()
        grid = itertools.product(*(self.sizes_of(axis) for axis in axes))
        return tuple(dict(zip(axes, sizes, strict=True)) for sizes in grid)

    def trace_case(self) -> dict[str, int]:
        """Sizes the module is traced at: the largest tested, so no dynamic axis is traced at 1."""
        return {axis: max(self.sizes_of(axis)) for axis in self._all_axes()}

    def _all_axes(self) -> tuple[str, ...]:
        batch = (self.batch_axis,) if self.batch_axis else ()
        return batch + self.dynamic_axes


def parse_input_spec(text: str) -> InputSpec:
    """Parse ``NAME:DTYPE:DIMS[:LOW..HIGH]``; errors quote the spec and name the part at fault."""
    parts = [part.strip() for part in text.split(":")]
    if len(parts) not in (3, 4):
        raise _bad(text, "expected NAME:DTYPE:DIMS[:LOW..HIGH]")
    name, dtype, dims = parts[:3]
    if not _IDENTIFIER.match(name):
        raise _bad(text, f"input name {name!r} must be a Python identifier (forward's parameter)")
    datatype = _parse_datatype(text, dtype)
    value_range = _parse_range(text, parts[3], datatype) if len(parts) == 4 else None
    return InputSpec(name, datatype, _parse_dims(text, dims), value_range)


def parse_sizes(text: str, *, option: str) -> tuple[int, ...]:
    """Parse ``1,3,8`` into positive sizes."""
    sizes = []
    for item in text.split(","):
        item = item.strip()
        if not ascii_digits(item) or int(item) == 0:
            raise InvalidArgument(f"{option} {text!r}: {item!r} is not a positive integer")
        sizes.append(int(item))
    return tuple(sizes)


def parse_axis_sizes(items: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``seq=1,7,33`` items into axis name -> sizes."""
    result: dict[str, tuple[int, ...]] = {}
    for item in items:
        axis, sep, sizes = item.partition("=")
        axis = axis.strip()
        if not sep or not _IDENTIFIER.match(axis):
            raise InvalidArgument(f"--axis-sizes {item!r}: expected AXIS=SIZE[,SIZE...]")
        if axis in result:
            raise InvalidArgument(f"--axis-sizes: axis '{axis}' is given twice")
        result[axis] = parse_sizes(sizes, option=f"--axis-sizes {axis}")
    return result


def _bad(spec: str, problem: str) -> InvalidArgument:
    return InvalidArgument(f"--input {spec!r}: {problem}")


def _parse_datatype(spec: str, text: str) -> DataType:
    wire = text.upper()
    if wire in EXPORTABLE_TYPES:
        return BY_WIRE[wire]
    expected = ", ".join(EXPORTABLE_TYPES)
    if wire in BY_WIRE:
        raise _bad(spec, f"datatype {wire} cannot come from PyTorch (use one of {expected})")
    raise _bad(spec, f"unknown datatype {text!r} (expected one of {expected})")


def _parse_dims(spec: str, text: str) -> tuple[int | str, ...]:
    if not text:
        raise _bad(spec, "DIMS is empty; give each axis a size or a name, e.g. batch,3,32,32")
    return tuple(_parse_dim(spec, item.strip()) for item in text.split(","))


def _parse_dim(spec: str, item: str) -> int | str:
    if _IDENTIFIER.match(item):
        return item
    if ascii_digits(item) and int(item) > 0:
        return int(item)
    raise _bad(spec, f"dim {item!r} is neither a positive size nor an axis name (e.g. batch, seq)")


def _parse_range(spec: str, text: str, datatype: DataType) -> ValueRange:
    if datatype.wire == "BOOL":
        raise _bad(spec, "BOOL inputs take no value range")
    low_text, sep, high_text = (part.strip() for part in text.partition(".."))
    if not sep:
        raise _bad(spec, f"value range {text!r} must be LOW..HIGH")
    low = _parse_bound(spec, low_text, datatype)
    if datatype.numpy.kind in "iu" and _IDENTIFIER.match(high_text):
        return ValueRange(low, high_text)  # an axis name: its size in each case
    high = _parse_bound(spec, high_text, datatype)
    if low > high:
        raise _bad(spec, f"value range {text!r} is empty (LOW > HIGH)")
    return ValueRange(low, high)


def _parse_bound(spec: str, text: str, datatype: DataType) -> float:
    if datatype.numpy.kind in "iu":
        return _integer_bound(spec, text, datatype)
    try:
        value = float(text)
    except ValueError:
        raise _bad(spec, f"range bound {text!r} is not a number") from None
    if not math.isfinite(value):
        raise _bad(spec, f"range bound {text!r} must be finite")
    return int(value) if value.is_integer() and "." not in text else value


def _integer_bound(spec: str, text: str, datatype: DataType) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _bad(spec, f"range bound {text!r} is not an integer ({datatype.wire})") from None
    info = np.iinfo(datatype.numpy.name)
    if not info.min <= value <= info.max:
        raise _bad(spec, f"range bound {value} does not fit {datatype.wire}")
    return value


def _check_scalars(spec: ExportSpec) -> None:
    if not _MODEL_NAME.match(spec.name) or ".." in spec.name:
        raise InvalidArgument(
            f"--name {spec.name!r}: a model name is letters, digits, '_', '-' and '.', "
            "and cannot start with '.' or '-'"
        )
    if spec.max_batch_size < 0:
        raise InvalidArgument(f"--max-batch-size must be >= 0, not {spec.max_batch_size}")
    if spec.version < 1:
        raise InvalidArgument(f"--version must be >= 1, not {spec.version}")
    if spec.opset < 7:
        raise InvalidArgument(f"--opset {spec.opset} is too old for this exporter (>= 7)")


def _check_names(inputs: Sequence[InputSpec], outputs: Sequence[str]) -> None:
    if not inputs:
        raise InvalidArgument("give at least one --input")
    _check_unique("input", [spec.name for spec in inputs])
    _check_unique("output", outputs)
    for name in outputs:
        if not name or any(spec.name == name for spec in inputs):
            raise InvalidArgument(f"--output {name!r}: empty, or also the name of an input")


def _check_unique(kind: str, names: Sequence[str]) -> None:
    twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
    if twice is not None:
        raise InvalidArgument(f"{kind} '{twice}' is declared twice")


def _batch_axis(inputs: Sequence[InputSpec], max_batch_size: int) -> str | None:
    if max_batch_size == 0:
        return None
    for spec in inputs:
        if not isinstance(spec.dims[0], str):
            raise InvalidArgument(
                f"input '{spec.name}': the first axis must be the named batch axis (e.g. "
                f"batch,{','.join(map(str, spec.dims))}) since --max-batch-size is "
                f"{max_batch_size}; use --max-batch-size 0 for a model without a batch axis"
            )
    names = {spec.dims[0] for spec in inputs}
    if len(names) > 1:
        found = ", ".join(f"'{spec.name}' uses '{spec.dims[0]}'" for spec in inputs)
        raise InvalidArgument(f"inputs disagree on the batch axis name: {found}")
    return str(inputs[0].dims[0])


def _check_sizes(spec: ExportSpec, batch_axis: str | None) -> None:
    if batch_axis and not spec.batch_sizes:
        raise InvalidArgument("--batch-sizes is empty")
    named = dict.fromkeys(axis for item in spec.inputs for axis in item.axes)
    for axis, sizes in spec.axis_sizes.items():
        if axis == batch_axis:
            raise InvalidArgument(f"--axis-sizes {axis}: that is the batch axis; use --batch-sizes")
        if axis not in named:
            known = ", ".join(a for a in named if a != batch_axis) or "none"
            raise InvalidArgument(f"--axis-sizes {axis}: no input has that axis (named: {known})")
        if not sizes or min(sizes) < 1:
            raise InvalidArgument(f"--axis-sizes {axis}: sizes must be positive integers")


def _check_ranges(inputs: Sequence[InputSpec]) -> None:
    named = {axis for spec in inputs for axis in spec.axes}
    for spec in inputs:
        high = spec.value_range.high if spec.value_range else None
        if isinstance(high, str) and high not in named:
            raise InvalidArgument(
                f"input '{spec.name}': range bound '{high}' names no axis "
                f"(axes: {', '.join(sorted(named)) or 'none'})"
            )


def _check_serving(spec: ExportSpec) -> None:
    serving = spec.serving
    tuned = serving.max_queue_delay_us is not None or serving.preferred_batch_sizes
    if tuned and not serving.dynamic_batching:
        raise InvalidArgument(
            "--max-queue-delay-us and --preferred-batch-size need --dynamic-batching"
        )
    if serving.dynamic_batching and spec.max_batch_size == 0:
        raise InvalidArgument("--dynamic-batching needs a batch axis (--max-batch-size > 0)")
    if (serving.max_queue_delay_us or 0) < 0:
        raise InvalidArgument("--max-queue-delay-us must be >= 0")
    for size in serving.preferred_batch_sizes:
        if not 1 <= size <= spec.max_batch_size:
            raise InvalidArgument(
                f"--preferred-batch-size {size} is outside 1..{spec.max_batch_size} "
                "(the max batch size)"
            )
    if serving.sequence_length_input is not None:
        _check_length_input(spec, serving.sequence_length_input)


def _check_length_input(spec: ExportSpec, name: str) -> None:
    found = spec.input(name)
    if found is None:
        known = ", ".join(item.name for item in spec.inputs)
        raise InvalidArgument(f"--sequence-length-input '{name}' is not an input ({known})")
    if spec.max_batch_size == 0 or found.dims[1:] != (1,) or found.datatype.numpy.kind not in "iu":
        raise InvalidArgument(
            f"--sequence-length-input '{name}' must be an integer input of shape [batch, 1] "
            f"(one length per sample), not {found}"
        )
