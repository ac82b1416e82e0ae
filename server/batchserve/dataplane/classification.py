"""Triton's classification extension: an output requested with ``classification: k`` is
answered with its k largest entries per sample, as BYTES ``"<value>:<index>[:<label>]"``.

Triton's behaviour is the contract (server ``src/classification.cc`` and the frontends that
apply it, ``src/http_server.cc``, ``src/grpc/infer_handler.h``):

- a model that batches keeps its batch axis: shape ``[batch, min(k, n)]``, where n is the
  element count of one sample (all its other axes flattened); otherwise ``[min(k, n)]``
  over the whole tensor;
- entries in descending value order; Triton's ``std::sort`` leaves ties unspecified (for up
  to 16 entries it keeps index order), so ties here are always in ascending index order,
  and NaN, which Triton's comparison cannot order, comes last;
- values as C++ ``std::to_string`` writes them: integers in full, FP32 and FP64 as
  ``printf("%f")`` (six decimals); FP16, BF16, BOOL and BYTES are refused;
- the label is the line of the output's ``label_filename`` at that index, omitted when the
  file has fewer lines or the line is empty;
- more than 1,000,000 elements per sample is refused.

Bounds of batchserve's own: at most 1,000,000 entries per classified output (k is the
client's to choose), and outputs of more than ``INLINE_BELOW`` elements are ranked in a
thread, so that a large sort never stalls the event loop's other requests.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from batchserve.core.datatypes import BYTES, DataType
from batchserve.core.errors import InvalidArgument
from batchserve.core.types import RequestedOutput, Tensor

Array = npt.NDArray[Any]
Labels = Mapping[str, Sequence[bytes]]

MAX_ELEMENTS: Final = 1_000_000
"""Per sample, as Triton bounds it (``kMaxClassificationElements``)."""
MAX_ENTRIES: Final = 1_000_000
"""Per classified output, all samples together: each entry becomes a string."""
INLINE_BELOW: Final = 1 << 14
"""Elements to rank below which classifying costs less than a hop to a thread."""
PARTITION_RATIO: Final = 8
"""Rows at least this many times wider than k are partitioned around the k-th value
before sorting (linear time), not sorted whole."""

_SUPPORTED: Final = frozenset(
    {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"}
)


def requested_counts(
    outputs: Sequence[RequestedOutput] | None, types: Mapping[str, DataType]
) -> dict[str, int]:
    """Each output asked for as classification and its k; refuses types Triton refuses.

    Called before inference, so a request that cannot be answered costs no model time.
    """
    if not outputs:
        return {}
    counts = {output.name: output.classification for output in outputs if output.classification}
    for name in counts:
        datatype = types[name]
        if datatype.wire not in _SUPPORTED:
            raise InvalidArgument(
                "class result not available for output due to unsupported type "
                f"'{datatype.wire}': output '{name}' cannot be classified (classification "
                "needs an integer, FP32 or FP64 output)"
            )
    return counts


async def classify_outputs(
    tensors: list[Tensor], counts: Mapping[str, int], labels: Labels, *, batched: bool
) -> list[Tensor]:
    """The response's outputs, those in ``counts`` replaced by their classification."""
    work = sum(t.data.size for t in tensors if t.name in counts)
    if work < INLINE_BELOW:
        return _classify_outputs(tensors, counts, labels, batched)
    return await asyncio.to_thread(_classify_outputs, tensors, counts, labels, batched)


def _classify_outputs(
    tensors: list[Tensor], counts: Mapping[str, int], labels: Labels, batched: bool
) -> list[Tensor]:
    return [
        classify(t, counts[t.name], labels.get(t.name, ()), batched=batched)
        if t.name in counts
        else t
        for t in tensors
    ]


def classify(tensor: Tensor, k: int, labels: Sequence[bytes], *, batched: bool) -> Tensor:
    """One output's top ``k`` entries per sample as a BYTES tensor."""
    array = np.asarray(tensor.data)
    batch = array.shape[0] if batched and array.ndim else 0
    count = math.prod(array.shape[1:]) if batch else array.size
    if count > MAX_ELEMENTS:
        raise InvalidArgument(
            f"classification output tensor too large: output '{tensor.name}' has {count} "
            f"elements per sample (at most {MAX_ELEMENTS})"
        )
    rows = array.reshape(max(batch, 1), count)
    _check_entries(tensor.name, rows.shape[0], min(k, count))
    top = _top(rows, min(k, count))
    values = np.take_along_axis(rows, top, axis=1)
    render = _render_float if array.dtype.kind == "f" else _render_int
    items = [
        _entry(render(value), index, labels)
        for value, index in zip(values.reshape(-1).tolist(), top.reshape(-1).tolist(), strict=True)
    ]
    shape = top.shape if batch else (top.shape[1],)
    data = np.fromiter(items, dtype=object, count=len(items)).reshape(shape)
    return Tensor(tensor.name, BYTES, shape, data)


def _check_entries(name: str, samples: int, per_sample: int) -> None:
    entries = samples * per_sample
    if entries > MAX_ENTRIES:
        raise InvalidArgument(
            f"classification output tensor too large: output '{name}' would hold {entries} "
            f"entries ({samples} samples x {per_sample} classes; at most {MAX_ENTRIES}); "
            "ask for fewer classes"
        )


def _top(rows: Array, k: int) -> Array:
    """Column indexes of each row's k largest values, in ``_descending`` order."""
    if k * PARTITION_RATIO >= rows.shape[1]:
        return _descending(rows)[:, :k]
    return np.stack([_top_of_row(row, k) for row in rows])


def _top_of_row(row: Array, k: int) -> Array:
    """Sort only the values at or above the k-th largest (ties there included, so the
    lowest indexes among them win, as in the full sort)."""
    if row.dtype.kind == "f":
        negated = -row
        kth = np.partition(negated, k - 1)[k - 1]  # NaN partitions last
        chosen = np.arange(row.size) if np.isnan(kth) else np.flatnonzero(negated <= kth)
    else:
        chosen = np.flatnonzero(row >= np.partition(row, row.size - k)[row.size - k])
    order: Array = chosen[_descending(row[chosen][np.newaxis, :])[0, :k]]
    return order


def _descending(rows: Array) -> Array:
    """Column indexes of each row by descending value; ties by ascending index, NaN last."""
    if rows.dtype.kind == "f":
        return np.argsort(-rows, axis=1, kind="stable")  # numpy sorts NaN last
    # integers cannot all be negated: sort the mirrored rows ascending and read backwards
    mirrored = np.argsort(rows[:, ::-1], axis=1, kind="stable")[:, ::-1]
    order: Array = rows.shape[1] - 1 - mirrored
    return order


def _render_int(value: int) -> bytes:
    return b"%d" % value


def _render_float(value: float) -> bytes:
    """``std::to_string``: printf's ``%f``, which (unlike Python's) keeps the sign of NaN."""
    if math.isnan(value) and math.copysign(1.0, value) < 0:
        return b"-nan"
    return b"%f" % value


def _entry(value: bytes, index: int, labels: Sequence[bytes]) -> bytes:
    label = labels[index] if index < len(labels) else b""
    return b"%s:%d:%s" % (value, index, label) if label else b"%s:%d" % (value, index)
