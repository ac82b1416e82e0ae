"""Triton's rate limiter (``--rate-limit execution_count``): its rules alone, its refusals
in Triton's words, and batchers of two models sharing it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from batchserve.core.device import CPU, Device
from batchserve.core.rate_limit import parse_rate_limit_resources
from batchserve.models.model_config import parse_pbtxt
from batchserve.observability.stats import ModelStats
from batchserve.proto.model_config_pb2 import ModelInstanceGroup
from batchserve.scheduler.batcher import Batcher
from batchserve.scheduler.instances import Instance, InstancePool
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.rate_limiter import (
    GLOBAL,
    InstanceLimits,
    RateLimiter,
    instance_limits,
)
from fakes import FakeBackend, fake_config
from harness import answers, item

pytestmark = pytest.mark.anyio


def test_an_instance_waits_until_what_it_needs_is_given_back() -> None:
    limiter = RateLimiter()
    a, b = object(), object()
    limiter.register(a, InstanceLimits((("r", 0, 4),)))
    limiter.register(b, InstanceLimits((("r", 0, 2),)))
    given: list[str] = []
    assert limiter.request(a, lambda: given.append("a"))
    assert not limiter.request(b, lambda: given.append("b"))  # 4 of 4 held
    limiter.release(a)
    assert given == ["b"]


def test_only_the_head_of_the_queue_is_served() -> None:
    """Triton gives resources to the head only: one that would fit waits behind it."""
    limiter = RateLimiter()
    big, small, running = object(), object(), object()
    limiter.register(big, InstanceLimits((("r", 0, 4),)))
    limiter.register(small, InstanceLimits((("r", 0, 1),)))
    limiter.register(running, InstanceLimits((("r", 0, 1),)))
    assert limiter.request(running, lambda: None)
    given: list[object] = []
    assert not limiter.request(big, lambda: given.append(big))
    assert not limiter.request(small, lambda: given.append(small))
    assert given == []
    limiter.release(running)
    assert given == [big]  # then small, behind it
    limiter.release(big)
    assert given == [big, small]


def test_priority_two_runs_half_as_often_while_both_wait() -> None:
    limiter = RateLimiter()
    one, two = object(), object()
    limiter.register(one, InstanceLimits((("r", GLOBAL, 1),), priority=1))
    limiter.register(two, InstanceLimits((("r", GLOBAL, 1),), priority=2))
    runs = {one: 0, two: 0}
    holder: list[object] = []
    for token in (one, two):
        if limiter.request(token, lambda t=token: holder.append(t)):
            holder.append(token)
    for _ in range(300):  # whoever holds the resource runs, then asks again at once
        token = holder.pop(0)
        runs[token] += 1
        limiter.release(token, again=lambda t=token: holder.append(t))
    assert runs[one] == pytest.approx(2 * runs[two], abs=2)


def test_withdrawn_resources_count_no_run() -> None:
    limiter = RateLimiter()
    a, b = object(), object()
    limiter.register(a, InstanceLimits((("r", 0, 1),), priority=1))
    limiter.register(b, InstanceLimits((("r", 0, 1),), priority=1))
    assert limiter.request(a, lambda: None)
    limiter.withdraw(a)  # given, not used
    assert limiter.request(b, lambda: None)
    given: list[object] = []
    assert not limiter.request(a, lambda: given.append(a))
    limiter.release(b)  # b ran once, a never: a is ahead of b now
    assert given == [a]


def test_tritons_refusals_in_its_words() -> None:
    limiter = RateLimiter()
    limiter.register(object(), InstanceLimits((("shared", GLOBAL, 1),)))
    assert limiter.problems([InstanceLimits((("shared", 0, 1),))]) == [
        'Resource "shared" is present as both global and device-specific resource in the '
        "model configuration."
    ]
    limited = RateLimiter(parse_rate_limit_resources(["resource1:2"]))
    needs = InstanceLimits((("resource1", 0, 4), ("resource2", GLOBAL, 1)))
    assert limited.problems([needs]) == [
        'Resource count for "resource1" is limited to 2 which will prevent scheduling of one '
        "or more model instances, the minimum required count is 4",
        # a resource no entry names has none, as in Triton
        'Resource count for "resource2" is limited to 0 which will prevent scheduling of one '
        "or more model instances, the minimum required count is 1",
    ]


def test_explicit_counts_by_device() -> None:
    limiter = RateLimiter(parse_rate_limit_resources(["r:3", "r:5:1", "g:2:0", "g:7:1"]))
    assert limiter.problems([InstanceLimits((("r", 0, 3), ("r", 1, 5), ("g", GLOBAL, 7)))]) == []
    assert limiter.problems([InstanceLimits((("r", 0, 4),))]) != []


@pytest.mark.parametrize("entry", ["r", "r:x", "r:1:2:3", ":", "r:1:d"])
def test_a_malformed_resource_entry_is_refused_in_tritons_words(entry: str) -> None:
    with pytest.raises(ValueError, match=r"^--rate-limit-resource option format is"):
        parse_rate_limit_resources([entry])


def test_an_instances_needs_come_from_its_group() -> None:
    group = ModelInstanceGroup()
    group.rate_limiter.priority = 0  # Triton reads 0 as 1
    group.rate_limiter.resources.add(name="local", count=2)
    shared = group.rate_limiter.resources.add(name="shared", count=1)
    setattr(shared, "global", True)
    limits = instance_limits(group, Device("gpu", 3))
    assert limits == InstanceLimits((("local", 3, 2), ("shared", GLOBAL, 1)), priority=1)
    assert instance_limits(group, CPU).needs[0] == ("local", 0, 2)


class _Overlap(FakeBackend):
    """Logs which model ran, and how many runs of any model were in progress at once."""

    def __init__(self, name: str, log: list[str], running: list[int]) -> None:
        super().__init__()
        self.name, self.log, self.running = name, log, running

    def infer(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        self.running[0] += 1
        self.running[1] = max(self.running[1], self.running[0])
        try:
            threading.Event().wait(0.001)
            self.log.append(self.name)
            return super().infer(inputs, output_names)
        finally:
            self.running[0] -= 1


def _model(
    limiter: RateLimiter, name: str, priority: int, log: list[str], running: list[int]
) -> Batcher:
    limits = InstanceLimits((("device", 0, 1),), priority)
    instance = Instance(f"{name}-0", _Overlap(name, log, running), limits=limits)
    policy = BatchPolicy.from_config(fake_config(), server_max_queue_size=256)
    return Batcher(InstancePool([instance], limiter), policy, ModelStats())


async def test_two_models_never_run_at_once_and_priority_orders_them() -> None:
    """One unit of a resource both need: their batches never overlap, and the model of
    priority 2 runs about half as often as the other while both have work."""
    limiter, log, running = RateLimiter(), [], [0, 0]
    first = _model(limiter, "first", 1, log, running)
    second = _model(limiter, "second", 2, log, running)
    items = []
    for _ in range(40):
        for batcher in (first, second):
            one = item(8, 1.0)  # a full batch each: runs, not rows, are counted
            batcher.submit(one)
            items.append(one)
    done = await answers(*items)
    assert all(np.array_equal(out["y"], np.full((8, 4), 3.0)) for out in done)
    assert running[1] == 1  # never two at once
    while_both = log[:45]  # the first has 40 batches: both have work for ~60 runs
    assert while_both.count("first") == pytest.approx(30, abs=3)
    assert first.stats.execution_count == second.stats.execution_count == 40


async def test_an_idle_model_holds_nothing() -> None:
    """Resources are asked for with a batch to run, and given back when there is none."""
    limiter, log, running = RateLimiter(), [], [0, 0]
    busy = _model(limiter, "busy", 1, log, running)
    waiting = _model(limiter, "waiting", 1, log, running)
    busy.submit(one := item(1, 2.0))
    await answers(one)
    await asyncio.sleep(0)
    other = object()
    limiter.register(other, InstanceLimits((("device", 0, 1),)))
    assert limiter.request(other, lambda: None)  # busy's finished batch holds nothing
    given: list[int] = []
    limiter.release(other)
    waiting.submit(two := item(1, 3.0))
    assert (await answers(two))[0]["y"].tolist() == [[7.0] * 4]
    assert given == []


def test_a_config_with_rate_limiter_still_parses_as_triton_writes_it() -> None:
    config = parse_pbtxt("""
        name: "m"
        instance_group [{ kind: KIND_CPU count: 1
          rate_limiter { resources [{ name: "resource1" count: 4 },
                                    { name: "resource2" global: True count: 2 }] priority: 2 }
        }]
    """)
    limits = instance_limits(config.instance_group[0], CPU)
    assert limits == InstanceLimits((("resource1", 0, 4), ("resource2", GLOBAL, 2)), 2)
