"""Triton's local response cache: keys, bounded LRU, and the batcher answering from it."""

from __future__ import annotations

import numpy as np
import pytest
from batchserve.core.cache_config import parse_cache_config
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.response_cache import (
    ENTRY_OVERHEAD,
    ResponseCache,
    local_cache,
    request_key,
)
from batchserve.scheduler.work import WorkItem
from fakes import FakeBackend
from harness import answer, item, make_batcher

pytestmark = pytest.mark.anyio


def test_a_key_covers_the_model_every_input_and_the_outputs_asked_for() -> None:
    x = {"x": np.arange(4, dtype=np.float32)}
    key = request_key(b"m\x001", x, ["y"])
    assert key == request_key(b"m\x001", {"x": np.arange(4, dtype=np.float32)}, ["y"])
    others = [
        request_key(b"m\x002", x, ["y"]),
        request_key(b"m\x001", {"x": np.arange(4, dtype=np.float64)}, ["y"]),
        request_key(b"m\x001", {"x": np.arange(4, dtype=np.float32).reshape(2, 2)}, ["y"]),
        request_key(b"m\x001", {"x": np.arange(1, 5, dtype=np.float32)}, ["y"]),
        request_key(b"m\x001", x, ["y", "total"]),
        request_key(b"m\x001", {"z": np.arange(4, dtype=np.float32)}, ["y"]),
    ]
    assert len({key, *others}) == 1 + len(others)
    strings = np.array([b"a\x00", b"b"], dtype=object)
    split = np.array([b"a", b"\x00b"], dtype=object)
    assert request_key(b"m", {"s": strings}, []) != request_key(b"m", {"s": split}, [])


def test_the_least_recently_used_entry_leaves_first_and_kept_arrays_are_read_only() -> None:
    entry = ENTRY_OVERHEAD + 400
    cache = ResponseCache(2 * entry)
    for key in (b"a", b"b"):
        cache.insert(key, {"y": np.zeros(100, np.float32)})
    assert cache.lookup(b"a") is not None  # a is now the most recent
    cache.insert(b"c", {"y": np.zeros(100, np.float32)})
    assert (cache.lookup(b"b"), len(cache), cache.evictions) == (None, 2, 1)
    kept = cache.lookup(b"c")
    assert kept is not None
    assert not kept["y"].flags.writeable
    cache.insert(b"huge", {"y": np.zeros(10_000, np.float32)})  # larger than the cache
    assert cache.lookup(b"huge") is None
    assert cache.bytes <= cache.max_bytes
    assert (cache.hits, cache.misses) == (2, 2)


def test_tritons_cache_config_is_read_and_other_caches_refused() -> None:
    assert parse_cache_config([]) == 0
    assert parse_cache_config(["local,size=1048576"]) == 1048576
    assert local_cache(0) is None
    for entry, words in (
        ("size=10", "No cache specified. --cache-config option format is"),
        ("local,size", "--cache-config option format is '<cache name>,<setting>=<value>'"),
        ("redis,host=localhost", "batchserve has Triton's local cache only"),
        ("local,capacity=3", "the local cache's one setting is size"),
        ("local,size=-1", "size must be a number of bytes"),
    ):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            parse_cache_config([entry])


async def test_a_repeated_request_is_answered_from_the_cache_without_running() -> None:
    backend = FakeBackend()
    batcher = make_batcher([backend])
    batcher.cache, batcher.cache_model = ResponseCache(1 << 20), b"fake\x001\x000"
    first = await answer(_submitted(batcher, item(2, 3.0)))
    again = _submitted(batcher, item(2, 3.0))
    assert again.future.done()  # at once, without a batch
    np.testing.assert_array_equal((await answer(again))["y"], first["y"])
    other = await answer(_submitted(batcher, item(2, 4.0)))
    assert not np.array_equal(other["y"], first["y"])
    assert backend.batches == [2, 2]  # the repeat never reached the model
    stats = batcher.stats
    assert (stats.cache_hit.count, stats.cache_miss.count) == (1, 2)
    assert stats.cache_miss.ns > 0


def _submitted(batcher: Batcher, request: WorkItem) -> WorkItem:
    batcher.submit(request)
    return request
