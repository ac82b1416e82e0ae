"""Merging requests into one batch and splitting the outputs back, exactly.

Inputs whose trailing shapes differ between requests (variable-length sequences) are
padded to the largest size in the batch; the model receives the true lengths through
its own length input, so padding never changes an answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from batchserve.scheduler.work import Arrays


class Merged(NamedTuple):
    """A batch's inputs, with what padding they carry.

    Args:
        arrays: one array per input name, requests stacked along the batch axis.
        padding: elements added as padding, over all inputs.
        elements: elements of ``arrays``, padding included.
    """

    arrays: Arrays
    padding: int
    elements: int


def _pad_and_stack(arrays: Sequence[np.ndarray], pad_value: float) -> np.ndarray:
    trailing = tuple(max(sizes) for sizes in zip(*(a.shape[1:] for a in arrays), strict=True))
    total = sum(a.shape[0] for a in arrays)
    merged = np.full((total, *trailing), pad_value, dtype=arrays[0].dtype)
    offset = 0
    for array in arrays:
        region = (slice(offset, offset + array.shape[0]), *(slice(0, d) for d in array.shape[1:]))
        merged[region] = array
        offset += array.shape[0]
    return merged


def merge_inputs(requests: Sequence[Arrays], pad_value: float = 0) -> Merged:
    """Requests stacked in order; ragged trailing axes padded with ``pad_value``."""
    if len(requests) == 1:
        elements = 0
        for array in requests[0].values():
            elements += array.size
        return Merged(requests[0], 0, elements)
    merged: Arrays = {}
    padding = elements = 0
    for name in requests[0]:
        arrays = [request[name] for request in requests]
        shape = arrays[0].shape[1:]
        if all(a.shape[1:] == shape for a in arrays):
            merged[name] = np.concatenate(arrays)
        else:
            merged[name] = _pad_and_stack(arrays, pad_value)
            padding += merged[name].size - sum(a.size for a in arrays)
        elements += merged[name].size
    return Merged(merged, padding, elements)


def split_outputs(outputs: Arrays, batch_sizes: Sequence[int]) -> list[Arrays]:
    """Each request's rows of every output, as views in request order."""
    if len(batch_sizes) == 1:
        return [outputs]
    parts: list[Arrays] = []
    offset = 0
    for size in batch_sizes:
        parts.append({name: array[offset : offset + size] for name, array in outputs.items()})
        offset += size
    return parts


def join_rows(pieces: Sequence[Arrays]) -> Arrays:
    """One request's outputs from the consecutive row ranges it was run in."""
    if len(pieces) == 1:
        return pieces[0]
    return {name: np.concatenate([piece[name] for piece in pieces]) for name in pieces[0]}
