"""Merging requests into one batch and splitting the outputs back, exactly.

Inputs whose trailing shapes differ between requests (variable-length sequences) are
padded to the largest size in the batch; the model receives the true lengths through
its own length input, so padding never changes an answer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from batchserve.scheduler.work import Arrays


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


def merge_inputs(requests: Sequence[Arrays], pad_value: float = 0) -> Arrays:
    """One array per input name, requests stacked along the batch axis in order."""
    if len(requests) == 1:
        return requests[0]
    merged: Arrays = {}
    for name in requests[0]:
        arrays = [request[name] for request in requests]
        if all(a.shape[1:] == arrays[0].shape[1:] for a in arrays):
            merged[name] = np.concatenate(arrays)
        else:
            merged[name] = _pad_and_stack(arrays, pad_value)
    return merged


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


def padding_waste(requests: Sequence[Arrays]) -> tuple[int, int]:
    """(padded elements, total elements) a merge of these requests would carry."""
    padded = total = 0
    for name in requests[0]:
        shapes = [r[name].shape for r in requests]
        trailing = [max(s) for s in zip(*(shape[1:] for shape in shapes), strict=True)]
        batch_total = sum(shape[0] for shape in shapes) * int(np.prod(trailing, dtype=np.int64))
        real = sum(int(np.prod(shape, dtype=np.int64)) for shape in shapes)
        padded += batch_total - real
        total += batch_total
    return padded, total
