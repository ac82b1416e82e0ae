"""Which settings a profile measures: instance count x max_batch_size x queue delay.

The grid follows Model Analyzer's automatic brute search (instance counts from 1, batch sizes
in powers of 2 up to 128) with the queue delay as a third axis; ``--quick`` keeps the few
points that tell most. The model's current values are always on their axes and its current
setting is one of the points, so the table shows where the config stands now and keeping it
is a possible recommendation. A model that does not batch is swept over instances only; a
sequence-batched one over instances and ``max_batch_size`` (its sequence slots), as Model
Analyzer sweeps it: the queue delay is the dynamic batcher's, which it does not use.
Every setting faces the same clients, so that rows differ by the setting alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from batchserve.core.errors import InvalidArgument


@dataclass(frozen=True, slots=True, order=True)
class Setting:
    """One point of the sweep: the three config.pbtxt fields a profile changes.

    Args:
        instances: ``count`` of every ``instance_group``.
        max_batch_size: ``max_batch_size``; 0 for a model that does not batch.
        queue_delay_us: ``dynamic_batching.max_queue_delay_microseconds``; None for a
            sequence-batched model, which has no dynamic batcher.
    """

    instances: int
    max_batch_size: int
    queue_delay_us: int | None

    @property
    def label(self) -> str:
        text = f"instances {self.instances}, max_batch_size {self.max_batch_size}"
        if self.queue_delay_us is None:
            return text
        return f"{text}, queue delay {self.queue_delay_us} us"


@dataclass(frozen=True, slots=True)
class Axes:
    """The values swept on each axis; None leaves that axis to the defaults."""

    instances: Sequence[int] | None = None
    max_batch_sizes: Sequence[int] | None = None
    queue_delays_us: Sequence[int] | None = None


FULL = Axes(instances=(1, 2, 4), max_batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128),
            queue_delays_us=(0, 1000, 10000))  # fmt: skip
"""Model Analyzer's defaults, thinned: its instance counts run 1-5, which on CPU instances
past the core count only adds points."""

QUICK = Axes(instances=(1, 2), max_batch_sizes=(1, 8), queue_delays_us=(0,))
"""No batching, small batches and the current config, one or two instances: about ten points
(two minutes' worth on 2 cores with ``QUICK_WINDOW``)."""

DEFAULT_CONCURRENCY = 16
"""perf_analyzer's clients when --concurrency is not given, for every setting alike: the
concurrency the project's benchmarks judge a compute-bound model at. A profile answers for
one offered load (by Little's law, more clients mean a longer wait for each), so it should be
the traffic's own."""


def plan(current: Setting, *, quick: bool, given: Axes = Axes()) -> list[Setting]:
    """The settings to measure, in order; ``given`` axes are taken exactly as written.

    A queue delay changes nothing where a batch holds one request, so batch sizes 0 and 1
    are measured at delay 0 only, but for the current setting itself where it lies on the
    axes: keeping it must be a possible answer, not a rewrite to an equivalent.
    """
    defaults = QUICK if quick else FULL
    batching = current.max_batch_size > 0
    delayed = current.queue_delay_us is not None
    _check(given, batching, delayed)
    instances = _axis(given.instances, defaults.instances, current.instances)
    sizes = _axis(given.max_batch_sizes, defaults.max_batch_sizes, current.max_batch_size)
    if not batching:
        sizes = [0]
    delays: list[int | None] = [None]  # sequence batching: there is no queue delay to set
    if current.queue_delay_us is not None:
        delays = [0]
        if batching:
            delays = [*_axis(given.queue_delays_us, defaults.queue_delays_us,
                             current.queue_delay_us)]  # fmt: skip
    settings = {
        Setting(count, size, delay)
        for count in instances
        for size in sizes
        for delay in (delays if size > 1 or not delayed else (0,))
    }
    on_axes = current.instances in instances and current.max_batch_size in sizes
    if on_axes and current.queue_delay_us in delays:
        settings.add(current)
    return sorted(settings)


def _axis(given: Sequence[int] | None, default: Sequence[int] | None, current: int) -> list[int]:
    if given is not None:
        return sorted(set(given))
    return sorted({*(default or ()), current})


def _check(given: Axes, batching: bool, delayed: bool) -> None:
    for flag, values, least in (
        ("--instance-counts", given.instances, 1),
        ("--max-batch-sizes", given.max_batch_sizes, 1),
        ("--queue-delays", given.queue_delays_us, 0),
    ):
        if values is not None and (not values or min(values) < least):
            raise InvalidArgument(f"{flag}: every value must be {least} or more")
    if not batching and (given.max_batch_sizes or given.queue_delays_us):
        raise InvalidArgument(
            "the model does not batch (max_batch_size 0: its first axis is not a batch axis), "
            "so --max-batch-sizes and --queue-delays do not apply"
        )
    if not delayed and given.queue_delays_us:
        raise InvalidArgument(
            "the model is sequence-batched (it has no dynamic batcher), so --queue-delays "
            "does not apply"
        )
