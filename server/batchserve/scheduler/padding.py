"""Variable-length sequences: each request's length, and the padding cut back off outputs.

A batch is padded to its longest request (which requests share one: ``length_buckets``).
Outputs that carry the sequence axis are cut back to each request's own length, so a
request gets what it would have got alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from batchserve.core.budgets import format_bytes
from batchserve.core.errors import InvalidArgument
from batchserve.scheduler.memory import Reservation
from batchserve.scheduler.policy import AxesOf, AxisOf, BatchPolicy
from batchserve.scheduler.work import Arrays


def check_lengths(policy: BatchPolicy, inputs: Arrays) -> None:
    """Each sample's true length (``batchserve.sequence_length_input``) is within 1 and the
    length it was sent with. A larger one reached the model as an index past the end of
    the sequence (ONNX Runtime's GatherElements failed: a 500 for a client's mistake)."""
    lengths = inputs.get(policy.length_input) if policy.length_input else None
    if lengths is None or lengths.size == 0:
        return
    sent = SequenceLayout(policy.sequence_inputs, ()).length(inputs)
    shortest, longest = lengths.min(), lengths.max()
    if shortest < 1 or longest > sent:
        raise InvalidArgument(
            f"input '{policy.length_input}': each sample's length must be within 1..{sent}, "
            f"the length of the sequence sent; got {shortest}..{longest}"
        )


def row_positions(axes: AxesOf, inputs: Mapping[str, np.ndarray]) -> int:
    """A row's positions: the largest product, over the inputs, of its free axes' sizes (a
    sequence model's: its padded length)."""
    most = 0
    for name, free in axes:
        array = inputs.get(name)
        if array is not None:
            shape = array.shape
            most = max(most, math.prod(shape[axis] for axis in free))
    return most


def check_steps(
    policy: BatchPolicy,
    model: str,
    inputs: Arrays,
    rows: int,
    lenders: Sequence[Reservation] = (),
) -> None:
    """A request holds no more positions (rows times a row's positions) than one batch may
    (``policy.max_batch_steps``, from the memory budget), or than the device budget could
    lend one of the model's instances for its run beyond that (``lenders``): 64 rows of
    10,000 tokens, a 4.9 MiB request, left char_lstm's instance holding 2.6 GiB; one 2048 x
    2048 image, a 48 MiB request, took a small CNN with free height and width from 1.4 to
    3.0 GiB."""
    most = policy.max_batch_steps
    if not most:
        return
    positions = row_positions(policy.position_inputs, inputs)
    total = rows * positions
    if total <= most or any(lender.could_lend(total) for lender in lenders):
        return
    lend = ""
    if lenders:
        lender = max(lenders, key=lambda one: one.unreserved_bytes() - one.extra_bytes(total))
        lend = (
            f", and the {format_bytes(lender.extra_bytes(total))} more it needs is more than "
            f"the {lender.device} budget has unreserved ({format_bytes(lender.unreserved_bytes())})"
        )
    if policy.length_input:
        layout = SequenceLayout(policy.sequence_inputs, ())
        raise InvalidArgument(
            f"input '{layout.longest(inputs)}': {rows} sequence(s) of length {positions} are "
            f"{total} steps, more than a batch of model '{model}' may hold ({most} steps, "
            f"derived from its memory budget){lend}; send shorter or fewer sequences, or "
            "raise batchserve.max_batch_steps"
        )
    name, free = max(
        ((name, free) for name, free in policy.position_inputs if name in inputs),
        key=lambda pair: math.prod(inputs[pair[0]].shape[axis] for axis in pair[1]),
    )
    sizes = " x ".join(str(inputs[name].shape[axis]) for axis in free)
    raise InvalidArgument(
        f"input '{name}': {rows} row(s) of {sizes} are {total} positions, more than a batch "
        f"of model '{model}' may hold ({most} positions, derived from its memory budget)"
        f"{lend}; send smaller or fewer rows, or raise batchserve.max_batch_steps"
    )


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

    def length(self, inputs: Mapping[str, np.ndarray]) -> int:
        """The request's (padded) length: what the batch would be padded to for it alone."""
        return max((inputs[name].shape[axis] for name, axis in self._inputs if name in inputs),
                   default=0)  # fmt: skip

    def longest(self, inputs: Mapping[str, np.ndarray]) -> str:
        """The name of the input whose sequence axis sets the request's length."""
        present = [(inputs[name].shape[axis], name) for name, axis in self._inputs
                   if name in inputs]  # fmt: skip
        return max(present, key=lambda pair: pair[0], default=(0, ""))[1]

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
