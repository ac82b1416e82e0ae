"""Triton's rate limiter (``--rate-limit execution_count``): instances of every model share
named resources, and an instance runs a batch only while it holds what its
``instance_group.rate_limiter`` says it needs.

Triton's rules (core ``rate_limiter.cc``), followed here:
- a resource is per device (an instance needs it on its own device) or, marked ``global``,
  one pool for the server; a name may not be both;
- its count is what ``--rate-limit-resource`` gives (a resource no entry names then has
  none), else the most any one instance needs;
- an instance with a batch to run waits in one queue with every other model's; the queue
  is ordered by how many batches each has run times its ``priority`` (at least 1), so an
  instance of priority 2 runs half as often as one of priority 1 while both have work;
  only the head is given its resources, and the rest wait behind it until it can run;
- what an instance holds goes back when its batch ends.

One limiter serves the whole server and lives on the event loop, as the batchers do.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from batchserve.core.device import Device
from batchserve.core.rate_limit import EVERY_DEVICE, ExplicitResources
from batchserve.proto.model_config_pb2 import ModelInstanceGroup

GLOBAL = -2
"""The device of a resource shared by every device."""

Need = tuple[str, int, int]
"""A resource's name, device (``GLOBAL`` for one shared by all) and count."""


@dataclass(frozen=True, slots=True)
class InstanceLimits:
    """What one instance needs to run a batch, and how often it yields to others."""

    needs: tuple[Need, ...] = ()
    priority: int = 1


def instance_limits(group: ModelInstanceGroup, device: Device) -> InstanceLimits:
    """An instance's needs from its group's ``rate_limiter``, on its device (a CPU
    instance's is device 0, as in Triton)."""
    index = device.index if device.kind == "gpu" else 0
    limiter = group.rate_limiter
    needs = tuple(
        (resource.name, GLOBAL if getattr(resource, "global") else index, resource.count)
        for resource in limiter.resources
    )
    return InstanceLimits(needs, max(1, limiter.priority))


class RateLimiter:
    """The resources of the server and the instances waiting for them (module docstring).

    ``Token`` is any hashable standing for one instance (the scheduler's ``Instance``)."""

    def __init__(self, explicit: ExplicitResources | None = None) -> None:
        self._explicit = dict(explicit or {})
        self._limits: dict[object, InstanceLimits] = {}
        self._held: Counter[tuple[str, int]] = Counter()
        self._runs: Counter[object] = Counter()
        self._staged: dict[object, tuple[int, Callable[[], None]]] = {}
        self._granted: set[object] = set()
        self._order = itertools.count()

    def problems(self, joining: Iterable[InstanceLimits]) -> list[str]:
        """Why instances with these limits may not join the registered ones, in Triton's
        words: a name both global and per device, or a need over what is given."""
        joining = list(joining)
        every = [need for limits in [*self._limits.values(), *joining] for need in limits.needs]
        shared = {name for name, device, _ in every if device == GLOBAL}
        local = {name for name, device, _ in every if device != GLOBAL}
        problems = [
            f'Resource "{name}" is present as both global and device-specific resource in the '
            "model configuration."
            for name in sorted(shared & local)
        ]
        if self._explicit:
            for name, device, count in dict.fromkeys(n for j in joining for n in j.needs):
                limit = self._capacity(name, device)
                if limit < count:
                    problems.append(
                        f'Resource count for "{name}" is limited to {limit} which will prevent '
                        "scheduling of one or more model instances, the minimum required "
                        f"count is {count}"
                    )
        return problems

    def register(self, token: object, limits: InstanceLimits) -> None:
        self._limits[token] = limits

    def unregister(self, token: object) -> None:
        self.withdraw(token)
        self._limits.pop(token, None)
        self._runs.pop(token, None)
        self._allocate()  # the most any instance needs may have fallen

    def request(self, token: object, granted: Callable[[], None]) -> bool:
        """Queue ``token`` for its resources: True if it holds them now; else ``granted``
        is called once it does."""
        if token not in self._granted and token not in self._staged:
            self._staged[token] = (next(self._order), _not_yet)
            self._allocate()
            if token in self._staged:
                self._staged[token] = (self._staged[token][0], granted)
        return token in self._granted

    def withdraw(self, token: object) -> None:
        """``token`` has nothing to run after all: out of the queue, or what it was given
        back, without counting a run."""
        self._staged.pop(token, None)
        if token in self._granted:
            self._give_back(token)
            self._allocate()

    def release(self, token: object, again: Callable[[], None] | None = None) -> None:
        """``token``'s batch has ended: its resources go back, and one more run counts.
        ``again``: it has another batch, and waits in the queue before anyone is given
        what it held (Triton stages it first), to be called once it holds them again."""
        if token in self._granted:
            self._give_back(token)
            self._runs[token] += 1
            if again is not None:
                self._staged[token] = (next(self._order), again)
            self._allocate()

    def _give_back(self, token: object) -> None:
        self._granted.discard(token)
        for name, device, count in self._limits.get(token, InstanceLimits()).needs:
            self._held[name, device] -= count

    def _allocate(self) -> None:
        """Give the head of the queue what it needs while it fits; the rest wait behind it."""
        while self._staged:
            head = min(self._staged, key=self._rank)
            needs = self._limits.get(head, InstanceLimits()).needs
            if any(self._held[n, d] + c > self._capacity(n, d) for n, d, c in needs):
                return
            _, granted = self._staged.pop(head)
            for name, device, count in needs:
                self._held[name, device] += count
            self._granted.add(head)
            granted()

    def _rank(self, token: object) -> tuple[int, int]:
        limits = self._limits.get(token, InstanceLimits())
        return self._runs[token] * limits.priority, self._staged[token][0]

    def _capacity(self, name: str, device: int) -> int:
        """How many of a resource there are (module docstring)."""
        if not self._explicit:
            return max(
                (c for limits in self._limits.values() for n, d, c in limits.needs
                 if n == name and d == device),
                default=0,
            )  # fmt: skip
        if device == GLOBAL:
            return max((c for (n, _), c in self._explicit.items() if n == name), default=0)
        return max(
            self._explicit.get((name, device), 0), self._explicit.get((name, EVERY_DEVICE), 0)
        )


def _not_yet() -> None:
    """The callback of a token being queued: it learns from ``request``'s answer."""


def rate_limiter_for(mode: str, explicit: ExplicitResources) -> RateLimiter | None:
    """The server's limiter under ``--rate-limit execution_count``; None for ``off``, where
    Triton ignores every ``rate_limiter``."""
    return RateLimiter(explicit) if mode == "execution_count" else None
