"""Triton's ``--cache-config <cache name>,<setting>=<value>`` entries, parsed once at start.

batchserve has Triton's ``local`` cache: ``size`` bytes (0: none) of responses in memory,
shared by the models whose config enables ``response_cache``. Triton's other caches (redis)
are refused by name, as is a setting the local cache does not have.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_CACHE_BYTES = 1 << 40


def parse_cache_config(entries: Sequence[str]) -> int:
    """The local cache's size in bytes (0 without one); ValueError in Triton's words for an
    entry not of its form, in ours for a cache or setting batchserve does not have."""
    size = 0
    for entry in entries:
        name, comma, setting = entry.partition(",")
        if not comma or not name:
            raise ValueError(
                "No cache specified. --cache-config option format is <cache name>,"
                f"<setting>=<value>. Got {entry[:64]}"
            )
        key, equals, value = setting.partition("=")
        if not equals or not key or not value:
            raise ValueError(
                f"--cache-config option format is '<cache name>,<setting>=<value>'. Got "
                f"{entry[:64]}"
            )
        if name != "local":
            raise ValueError(
                f"--cache-config {entry[:64]!r}: batchserve has Triton's local cache only, "
                f"not '{name[:32]}'"
            )
        if key != "size":
            raise ValueError(
                f"--cache-config {entry[:64]!r}: the local cache's one setting is size (bytes)"
            )
        if not value.isascii() or not value.isdigit() or int(value) > MAX_CACHE_BYTES:
            raise ValueError(
                f"--cache-config {entry[:64]!r}: size must be a number of bytes up to "
                f"{MAX_CACHE_BYTES}"
            )
        size = int(value)
    return size
