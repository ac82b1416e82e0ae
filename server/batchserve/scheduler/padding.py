"""Variable-length sequences: group requests by length, cut the padding back off outputs.

A batch is padded to its longest request, so every shorter one costs padded compute.
Taking, after the head of the queue, the waiting requests whose length is closest to the
head's keeps that waste small without starving anyone: the head always goes first, and
the look-ahead is bounded. Outputs that carry the sequence axis are cut back to each
request's own length, so a request gets what it would have got alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from batchserve.scheduler.policy import AxisOf
from batchserve.scheduler.work import Arrays, WorkItem

LOOKAHEAD = 4
"""How many batches' worth of queued requests grouping looks through."""


class SequenceLayout:
    """Where a model's inputs and outputs keep their sequence axis (empty: not a sequence model).

    Args:
        inputs: (name, axis) of each input with a sequence axis; a request's length is the
            longest of them.
        outputs: (name, axis) of each output with one.
    """

    def __init__(self, inputs: AxisOf, outputs: AxisOf) -> None:
        self._inputs = inputs
        self._outputs = outputs

    def __bool__(self) -> bool:
        return bool(self._inputs)

    def length(self, inputs: Arrays) -> int:
        """The request's (padded) length: what the batch would be padded to for it alone."""
        return max((inputs[name].shape[axis] for name, axis in self._inputs if name in inputs),
                   default=0)  # fmt: skip

    def trim(self, outputs: Arrays, length: int, batch_length: int) -> Arrays:
        """Cut outputs run at ``batch_length`` back to ``length``.

        Only an output whose axis has exactly the batch's padded length follows the input's
        length; any other size is the model's own and is left alone.
        """
        if length >= batch_length or not self._outputs:
            return outputs
        trimmed = dict(outputs)
        for name, axis in self._outputs:
            array = outputs.get(name)
            if array is not None and array.shape[axis] == batch_length:
                trimmed[name] = array[(slice(None),) * axis + (slice(0, length),)]
        return trimmed


def closest_first(head: WorkItem, window: Sequence[WorkItem]) -> list[WorkItem]:
    """The window ordered by how far each length is from the head's (queue order on ties)."""
    target = head.sequence_length
    return sorted(window, key=lambda item: abs(item.sequence_length - target))
