"""A least-recently-used map of bounded size, for memos keyed by what clients send.

Clients choose the keys (request headers, tensor layouts), so a memo must stay small
whatever they send: past ``size`` entries the least recently used one goes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """At most ``size`` entries; ``get`` marks an entry as recently used."""

    __slots__ = ("_items", "_size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"an LruCache holds at least one entry, not {size}")
        self._items: OrderedDict[K, V] = OrderedDict()
        self._size = size

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self._size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items
