"""The unit the scheduler queues: one request's validated arrays and its future."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from batchserve.core.types import SequenceFlags

Arrays = dict[str, np.ndarray]
Outcome = Arrays | BaseException
"""What a request ends with: its outputs, or the error it failed with."""


@dataclass(slots=True, eq=False)
class WorkItem:
    """One request inside the scheduler.

    Args:
        inputs: validated input arrays; batch axis first when the model batches.
        batch_size: samples this request contributes (its leading dimension, or 1).
        output_names: outputs to compute for it.
        priority: 1 is the highest level.
        enqueued_ns: time it entered the queue, on the batcher's clock.
        deadline_ns: time after which it must not start; None for no deadline.
        future: resolved with the request's own slice of the outputs.
        is_cancelled: True once the client has gone away.
        dispatched_ns: set by the batcher when its batch starts.
        executed_batch_size: set then too: the samples of the whole batch it ran in.
        planned_finish_ns: set then too, with a latency objective: when its batch was planned
            to finish (its due time plus the predicted batch time).
        ticket: set by the batcher: its place in submission order.
        row_positions: set by the batcher for a model with free axes: a row's positions
            (a sequence model's padded length, an image's pixels).
        clients: the requests it answers: more than one for a group a worker handed over
            as one item. The batcher's waiting rules count clients, not items.
        sequence: its place in a stateful sequence (``sequences.py``); None otherwise.
        urgent: its batch goes at once, without waiting for company: the steps of a
            generation loop (``generation.py``), whose next step waits on this one.
        delay_at_ns: under Triton's ``timeout_action: DELAY``, when its queue timeout
            passes: it then waits behind its level's requests still within theirs
            (``queue.py``) instead of being refused; None otherwise.
        delayed: set by the queue once that has happened.
        compute_ns: set by the run that answered it: when the run began, its inputs were
            gathered, the model returned and the outputs were split (a trace's compute
            timestamps); () until then.
    """

    inputs: Arrays
    batch_size: int
    output_names: tuple[str, ...]
    priority: int
    enqueued_ns: int
    deadline_ns: int | None
    future: asyncio.Future[Arrays]
    is_cancelled: Callable[[], bool] | None = None
    dispatched_ns: int = 0
    executed_batch_size: int = 0
    planned_finish_ns: int = 0
    ticket: int = 0
    row_positions: int = 0
    clients: int = 1
    sequence: SequenceFlags | None = None
    urgent: bool = False
    delay_at_ns: int | None = None
    delayed: bool = False
    compute_ns: tuple[int, int, int, int] | tuple[()] = ()

    def abandoned(self) -> bool:
        """True when nobody waits for the answer any more."""
        return self.future.done() or (self.is_cancelled is not None and self.is_cancelled())

    def finish(self, outcome: Outcome) -> None:
        """Resolve the future (once); a non-Exception outcome such as cancellation cancels it."""
        future = self.future
        if future.done():
            return
        if not isinstance(outcome, BaseException):
            future.set_result(outcome)
        elif isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.cancel()
