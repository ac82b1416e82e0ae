"""The bounded memo that client-chosen keys cannot grow."""

from __future__ import annotations

import pytest
from batchserve.core.lru import LruCache


def test_holds_at_most_its_size_dropping_the_least_recently_used() -> None:
    cache: LruCache[str, int] = LruCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # now "b" is the least recently used
    cache.put("c", 3)
    assert len(cache) == 2
    assert "b" not in cache
    assert cache.get("a") == 1
    assert cache.get("c") == 3
    assert cache.get("b") is None


def test_putting_a_known_key_replaces_it_and_marks_it_used() -> None:
    cache: LruCache[str, int] = LruCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert cache.get("a") == 10
    assert "b" not in cache


def test_bounded_whatever_the_keys() -> None:
    cache: LruCache[int, int] = LruCache(16)
    for key in range(10_000):
        cache.put(key, key)
    assert len(cache) == 16
    assert all(key in cache for key in range(10_000 - 16, 10_000))


def test_refuses_a_size_below_one() -> None:
    with pytest.raises(ValueError, match="at least one"):
        LruCache(0)
