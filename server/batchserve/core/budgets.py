"""The ``--memory-budget`` flag: how much of each kind of device the server may use.

Parsed once, with the other settings; the scheduler's ``DeviceBudget`` applies it to each
device's measured total.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from batchserve.core.device import DeviceKind

_PREFIXES = ("", "k", "m", "g", "t")
_SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[kmgt]i?b?|b)?", re.I)
_PERCENT = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*%")
_MIN_BYTES = 1 << 20
_KINDS: dict[str, DeviceKind] = {"cpu": "cpu", "gpu": "gpu"}


def format_bytes(nbytes: int) -> str:
    """``1.2 GiB``, ``96 MiB``, ``512 B``: what an operator reads in an error message."""
    value, unit = float(nbytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "B":
        return f"{nbytes} B"
    return f"{value:.1f} {unit}" if abs(value) < 10 else f"{value:.0f} {unit}"


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    """How much of a device the budget may use: a fraction of its total, or a byte count.

    Args:
        fraction: share of the device's total memory, in (0, 1].
        nbytes: an absolute size; larger than the device means the whole device.
    """

    fraction: float | None = None
    nbytes: int | None = None

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.nbytes is None):
            raise ValueError("a memory budget is either a fraction or a byte count")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"fraction {self.fraction:g} is not in (0, 1]")
        if self.nbytes is not None and self.nbytes < _MIN_BYTES:
            raise ValueError(
                f"{self.nbytes} bytes is below 1 MiB (a fraction is written 0.8 or 80%)"
            )

    def of(self, total_bytes: int) -> int:
        """The budget on a device with ``total_bytes`` of memory."""
        if self.fraction is not None:
            return int(total_bytes * self.fraction)
        return min(total_bytes, self.nbytes or 0)


DEFAULT_BUDGET = BudgetSpec(fraction=0.9)


def parse_budget(text: str) -> BudgetSpec:
    """``0.8`` or ``80%`` (a fraction); ``512MiB``, ``8GiB``, ``8Gi``, ``2147483648`` (bytes)."""
    value = text.strip()
    if percent := _PERCENT.fullmatch(value):
        return _checked(text, fraction=float(percent["number"]) / 100)
    size = _SIZE.fullmatch(value)
    if size is None:
        raise ValueError(
            f"memory budget {text!r} is neither a fraction (0.8, 80%) nor a size "
            "(512MiB, 8GiB, 2147483648)"
        )
    number, unit = size["number"], (size["unit"] or "").lower()
    if "." in number and not unit:
        return _checked(text, fraction=float(number))
    prefix = unit[0] if unit[:1] in ("k", "m", "g", "t") else ""
    scale = (1024 if "i" in unit else 1000) ** _PREFIXES.index(prefix)
    return _checked(text, nbytes=int(float(number) * scale))


def _checked(text: str, *, fraction: float | None = None, nbytes: int | None = None) -> BudgetSpec:
    try:
        return BudgetSpec(fraction, nbytes)
    except ValueError as exc:
        raise ValueError(f"memory budget {text!r}: {exc}") from None


def parse_budgets(text: str | None) -> dict[DeviceKind, BudgetSpec]:
    """The ``--memory-budget`` flag: one value for every device, or ``cpu=8GiB,gpu=0.9``;
    a kind left out (or no flag) gets ``DEFAULT_BUDGET``, 0.9 of the device."""
    if text is None or not text.strip():
        return {"cpu": DEFAULT_BUDGET, "gpu": DEFAULT_BUDGET}
    if "=" not in text:
        spec = parse_budget(text)
        return {"cpu": spec, "gpu": spec}
    specs: dict[DeviceKind, BudgetSpec] = {"cpu": DEFAULT_BUDGET, "gpu": DEFAULT_BUDGET}
    for part in text.split(","):
        name, _, value = part.partition("=")
        kind = _KINDS.get(name.strip().lower())
        if kind is None:
            raise ValueError(
                f"memory budget {text!r}: {name.strip()!r} is not a device kind "
                "(write cpu=... and/or gpu=...)"
            )
        specs[kind] = parse_budget(value)
    return specs
