"""Triton's ``--rate-limit-resource <name>:<count>[:<device>]`` entries, parsed once at start.

They say how many of a named resource the server has (``scheduler/rate_limiter.py``): on one
device, or, without a device, on every device. A resource a model's config declares
``global`` is one pool for the server, and takes the largest count given for its name,
whatever the device. Without an entry, a resource's count is the most any one instance
needs, so that every instance can run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

EVERY_DEVICE = -1
"""The device of an entry given without one: it applies to every device."""

ExplicitResources = Mapping[tuple[str, int], int]
"""Each (resource, device) pair's count; device ``EVERY_DEVICE`` for every device."""

RATE_LIMIT_MODES = ("off", "execution_count")


def parse_rate_limit_resources(entries: Sequence[str]) -> ExplicitResources:
    """The entries by resource and device (a later one wins); ValueError in Triton's words
    for an entry not of its form."""
    counts: dict[tuple[str, int], int] = {}
    for entry in entries:
        shown = entry[:128]
        form = (
            "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
            f"'<resource_name>:<count>'. Got {shown}"
        )
        parts = entry.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(form)
        name, numbers = parts[0], parts[1:]
        if not all(_is_int(number) for number in numbers):
            raise ValueError(f"{form}: the count and the device are integers")
        count = int(numbers[0])
        device = int(numbers[1]) if len(numbers) == 2 else EVERY_DEVICE
        if count < 0:
            raise ValueError(f"{form}: the count is negative")
        counts[name, device] = count
    return counts


def _is_int(text: str) -> bool:
    digits = text[1:] if text[:1] in "+-" else text
    return digits.isascii() and digits.isdigit()
