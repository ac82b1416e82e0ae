"""A UINT8 image input: clients send one byte per channel value, and the exported graph
itself turns the bytes into the float NCHW tensor the module was trained on.

``--input image:UINT8:batch,224,224,3 --normalize mean=0.485,0.456,0.406 std=0.229,0.224,0.225``
exports ``module((bytes * scale - mean) / std)``, with the bytes moved from NHWC to NCHW; the
module still takes float NCHW. ``to_float`` is the same conversion done here in numpy:
verification feeds its result to the unchanged module, so the nodes baked into the graph are
checked against a computation of their own, not against themselves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from batchserve.core.datatypes import BY_WIRE
from batchserve.core.errors import InvalidArgument

if TYPE_CHECKING:
    from batchserve.export.spec import ExportSpec, InputSpec

Array = npt.NDArray[Any]
LAYOUTS = ("NHWC", "NCHW")
DEFAULT_SCALE = 1 / 255  # bytes 0..255 to 0..1, where torchvision's mean and std apply
BYTE_RANGE = (0, 255)  # random test values of an image input without a declared range
CHANNEL_SIZES = (1, 3, 4)  # grey, RGB, RGBA: how a channel axis is told from height or width
_KEYS = ("input", "mean", "std", "scale")
_CHANNEL_AXIS = {"NHWC": -1, "NCHW": -3}


@dataclass(frozen=True, slots=True)
class ImageInput:
    """How one UINT8 input becomes the float NCHW tensor the module takes.

    Args:
        input: the input's name (forward's parameter).
        layout: the layout clients send, ``NHWC`` (channels last) or ``NCHW``; the last three
            axes are the image, any before them (the batch) stay where they are.
        mean: per channel, or one value for every channel; subtracted after ``scale``.
        std: likewise; divides after ``mean``.
        scale: multiplies each byte first (1/255 maps 0..255 to 0..1).
    """

    input: str
    layout: str = "NHWC"
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    scale: float = DEFAULT_SCALE

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise InvalidArgument(f"--layout {self.layout!r}: expected NHWC or NCHW")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise InvalidArgument(f"--normalize scale={self.scale}: must be a finite number > 0")
        for label, values in (("mean", self.mean), ("std", self.std)):
            if not values or not all(math.isfinite(v) for v in values):
                raise InvalidArgument(f"--normalize {label}: give finite numbers, not {values}")
        if min(self.std) <= 0:
            raise InvalidArgument(f"--normalize std: every value must be > 0, not {self.std}")

    @property
    def channel_axis(self) -> int:
        return _CHANNEL_AXIS[self.layout]

    def permutation(self, rank: int) -> tuple[int, ...] | None:
        """Axes that take the wire layout to NCHW (None when it already is NCHW)."""
        if self.layout == "NCHW":
            return None
        return (*range(rank - 3), rank - 1, rank - 3, rank - 2)

    def float_dims(self, dims: Sequence[int | str]) -> tuple[int | str, ...]:
        """The module's NCHW dims for the wire dims."""
        order = self.permutation(len(dims)) or range(len(dims))
        return tuple(dims[axis] for axis in order)

    def affine(self) -> tuple[Array, Array]:
        """``(multiplier, offset)`` shaped [C, 1, 1] for NCHW floats: ``(x * scale - mean) / std``
        as one multiply-add per element, ``x * (scale / std) + (-mean / std)``."""
        mean, std = np.broadcast_arrays(np.asarray(self.mean), np.asarray(self.std))
        multiplier = (self.scale / std).astype(np.float32)
        offset = (-mean / std).astype(np.float32)
        return multiplier[:, None, None], offset[:, None, None]

    def to_float(self, image: Array) -> Array:
        """The float NCHW tensor the module is given for ``image``, computed in numpy (float64)."""
        values = image.astype(np.float64) * self.scale
        mean, std = np.asarray(self.mean), np.asarray(self.std)
        if self.layout == "NHWC":
            values = np.moveaxis((values - mean) / std, -1, -3)
        else:
            values = (values - mean[:, None, None]) / std[:, None, None]
        return np.ascontiguousarray(values, dtype=np.float32)

    def convert(self, arrays: Mapping[str, Array]) -> dict[str, Array]:
        """The module's inputs for the wire inputs: the image converted, the others as they are."""
        return {
            name: self.to_float(array) if name == self.input else array
            for name, array in arrays.items()
        }

    def float_spec(self, spec: ExportSpec) -> ExportSpec:
        """The spec of the module itself: the image as the FP32 NCHW tensor it takes."""
        inputs = tuple(
            replace(
                item, datatype=BY_WIRE["FP32"], dims=self.float_dims(item.dims), value_range=None
            )
            if item.name == self.input
            else item
            for item in spec.inputs
        )
        return replace(spec, inputs=inputs, image_input=None)

    def check(self, spec: ExportSpec) -> None:
        """The input exists, is UINT8, and has a fixed channel axis the mean and std fit."""
        item = spec.input(self.input)
        if item is None:
            known = ", ".join(i.name for i in spec.inputs)
            raise InvalidArgument(f"--normalize input={self.input}: no such input ({known})")
        if item.datatype.wire != "UINT8":
            raise InvalidArgument(
                f"--normalize needs a UINT8 input (clients send one byte per value): "
                f"input '{item.name}' is {item.datatype.wire}"
            )
        if len(item.dims) < 3 + int(spec.max_batch_size > 0):
            raise InvalidArgument(
                f"--normalize: input '{item.name}' has dims {_dims(item)}; an image is "
                "[batch,]H,W,C (NHWC) or [batch,]C,H,W (NCHW)"
            )
        channels = item.dims[self.channel_axis]
        if not isinstance(channels, int):
            raise InvalidArgument(
                f"--normalize: the channel axis of input '{item.name}' ({self.layout}: "
                f"'{channels}') must be a fixed size"
            )
        for label, values in (("mean", self.mean), ("std", self.std)):
            if len(values) not in (1, channels):
                raise InvalidArgument(
                    f"--normalize {label} has {len(values)} values for the {channels} channels "
                    f"of input '{item.name}' ({self.layout}); give 1 or {channels}"
                )

    def __str__(self) -> str:
        numbers = ",".join
        return (
            f"{self.input}: UINT8 {self.layout} -> FP32 NCHW as (x * {self.scale:.6g} - mean) / "
            f"std, mean={numbers(f'{v:g}' for v in self.mean)} "
            f"std={numbers(f'{v:g}' for v in self.std)}"
        )


def parse_normalize(
    items: Sequence[str], layout: str | None, inputs: Sequence[InputSpec]
) -> ImageInput:
    """``--normalize [input=NAME] [mean=R,G,B] [std=R,G,B] [scale=S]`` and ``--layout``.

    The pairs may be separate arguments or one (``mean=...,std=...``). ``input`` defaults to
    the only UINT8 input, ``scale`` to 1/255 (``A/B`` is accepted), ``mean`` to 0, ``std`` to
    1; without ``--layout`` the layout is told from where a channel-sized axis sits.
    """
    values = _pairs(items)
    name = values["input"] if "input" in values else _only_byte_input(inputs)
    mean = _numbers("mean", values.get("mean", "0"))
    std = _numbers("std", values.get("std", "1"))
    scale = _scale(values["scale"]) if "scale" in values else DEFAULT_SCALE
    if layout is None:
        item = next((i for i in inputs if i.name == name), None)
        layout = _infer_layout(item, {len(mean), len(std)}) if item else LAYOUTS[0]
    return ImageInput(name, layout, mean, std, scale)


def _pairs(items: Sequence[str]) -> dict[str, str]:
    """KEY=VALUE pairs, apart or in one argument (``mean=0.5,0.5,0.5,std=...``; a space or
    ``;`` separates too): a part without ``=`` continues the value before it."""
    pairs: dict[str, list[str]] = {}
    current: list[str] | None = None
    for part in " ".join(items).replace(",", " ").replace(";", " ").split():
        key, sep, value = part.partition("=")
        if not sep:
            if current is None:
                raise InvalidArgument(f"--normalize: expected KEY=VALUE, got {part!r}")
            current.append(part)
            continue
        if key not in _KEYS:
            raise InvalidArgument(f"--normalize: unknown key {key!r} (expected {', '.join(_KEYS)})")
        if key in pairs:
            raise InvalidArgument(f"--normalize: {key} is given twice")
        current = pairs[key] = [value] if value else []
    for key, parts in pairs.items():
        if not parts:
            raise InvalidArgument(f"--normalize {key}= has no value")
    return {key: ",".join(parts) for key, parts in pairs.items()}


def _only_byte_input(inputs: Sequence[InputSpec]) -> str:
    names = [item.name for item in inputs if item.datatype.wire == "UINT8"]
    if len(names) == 1:
        return names[0]
    if names:
        raise InvalidArgument(
            f"--normalize: several UINT8 inputs ({', '.join(names)}); say which with input=NAME"
        )
    declared = ", ".join(f"'{item.name}' is {item.datatype.wire}" for item in inputs)
    raise InvalidArgument(
        f"--normalize needs a UINT8 input (clients send one byte per value): {declared}"
    )


def _numbers(key: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise InvalidArgument(
            f"--normalize {key}={text}: expected numbers, e.g. 0.5,0.5,0.5"
        ) from None


def _scale(text: str) -> float:
    numerator, slash, denominator = text.partition("/")
    try:
        value = float(numerator) / float(denominator) if slash else float(text)
    except (ValueError, ZeroDivisionError):
        raise InvalidArgument(f"--normalize scale={text}: expected a number or A/B") from None
    return value


def _infer_layout(item: InputSpec, counts: set[int]) -> str:
    """NHWC when only the last axis is channel-sized, NCHW when only the third from last is.

    Per-channel mean or std say how many channels to look for; if no axis has that many (a
    mistake ``ImageInput.check`` then names), or they are not given, 1, 3 or 4.
    """
    if len(item.dims) < 3:
        return LAYOUTS[0]  # too few axes for an image: ImageInput.check says so
    found: list[str] = []
    for sizes in (counts - {1}, set(CHANNEL_SIZES)):
        found = [layout for layout, axis in _CHANNEL_AXIS.items() if item.dims[axis] in sizes]
        if found:
            break
    if len(found) == 1:
        return found[0]
    raise InvalidArgument(
        f"--normalize: cannot tell whether input '{item.name}' ({_dims(item)}) is NHWC or "
        "NCHW; say --layout NHWC or --layout NCHW"
    )


def _dims(item: InputSpec) -> str:
    return ",".join(str(d) for d in item.dims)
