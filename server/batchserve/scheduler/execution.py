"""One batch on its instance's thread: merge, infer, split back, and recover from failures.

- OutOfMemory on more than one sample: the batch is halved (by requests; a lone request by
  rows, its outputs joined back, but for a model with ragged batching, whose batch inputs
  describe requests: ``batch_io.py``) and each half retried, recursively, so no request is
  lost because it shared a batch. The batcher then lowers its cap from what the run learned.
- Another BackendError (or InvalidArgument) on several requests: the batch is bisected by
  requests so that only the requests failing alone get the error. At most 2*ceil(log2 n) extra
  runs: enough to isolate one poisoned request exactly, bounded when the runtime is broken.
- A run of more positions than the instance's reservation holds (a request admitted alone
  past it) borrows the rest from the device budget for its time, waiting while other loans
  hold it, and asks the runtime to give back what it would keep of it afterwards.
- A batch whose clients all went away is interrupted (``run_watch.py``): the runtime stops
  the run where it can, and nothing more of the batch runs (no retry, no split); every
  request is answered as cancelled.

Statistics are only collected here; the event loop records them (counters are not locked).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import NamedTuple

from batchserve.backends.base import Backend
from batchserve.core.errors import BackendError, InvalidArgument, OutOfMemory
from batchserve.scheduler.batch_io import BatchIO
from batchserve.scheduler.batching import join_rows, merge_inputs, split_outputs
from batchserve.scheduler.memory import Reservation
from batchserve.scheduler.padding import SequenceLayout
from batchserve.scheduler.work import Arrays, Outcome, WorkItem


class Execution(NamedTuple):
    """One successful backend run: its samples, timings and padding."""

    samples: int
    input_ns: int
    infer_ns: int
    output_ns: int
    padding: int
    elements: int
    cpu_ns: int = 0
    """CPU time of the thread that ran it, over the same span; 0 when not taken."""


Part = tuple[int, int, int]
"""Rows ``start:stop`` of the batch's request number ``index``: (index, start, stop)."""


class BatchRun:
    """Runs a batch to one outcome per request; called once, on the instance's thread."""

    def __init__(
        self,
        backend: Backend,
        batch: Sequence[WorkItem],
        pad_value: float,
        layout: SequenceLayout,
        *,
        cpu_clock: bool = False,
        lender: Reservation | None = None,
        batch_io: BatchIO | None = None,
    ) -> None:
        self._backend = backend
        self._batch_io = batch_io
        """Ragged batching (``batch_io.py``): its batches are made and taken apart so, and
        are cut by requests only, since what the model computes from depends on them."""
        self._lender = lender
        """The instance's reservation, where counted in positions: a run of more positions
        than it holds borrows the rest for its time (a request admitted alone past it)."""
        self._cpu_clock = cpu_clock
        """Take the thread's CPU time too (``Execution.cpu_ns``): a system call each way,
        paid only where the batcher uses it."""
        self._batch = batch
        self._pad_value = pad_value
        self._layout = layout if layout else None
        self._names = _output_names(batch)
        self._outputs: list[Arrays | None] = [None] * len(batch)
        self._pieces: dict[int, list[Arrays]] = {}  # requests run in row ranges
        self._errors: list[BaseException | None] = [None] * len(batch)
        self._failed = False
        self._retries = 2 * math.ceil(math.log2(len(batch))) if len(batch) > 1 else 0
        self.executions: list[Execution] = []
        self.oom_splits = 0
        self.largest_ok = 0
        """Most samples a run succeeded with."""
        self.smallest_oom = 0
        """Fewest samples (more than one) a run ran out of memory with; 0 if none did."""
        self.interrupted = False
        """Its clients all went away (``interrupt``)."""
        self.stopped = False
        """Interrupted before all of it ran: stopped by the runtime, or a part left unrun."""

    def __call__(self) -> list[Outcome]:
        whole = [(index, 0, item.batch_size) for index, item in enumerate(self._batch)]
        self._attempt(whole, whole=True)
        return self._outcomes()

    def interrupt(self) -> None:
        """Called on the event loop: nobody waits for the batch any more. The run in
        progress is stopped where the runtime can, and no further run starts."""
        self.interrupted = True
        self._backend.interrupt()

    def _attempt(self, parts: list[Part], *, whole: bool = False) -> None:
        if self._failed:
            parts = [part for part in parts if self._errors[part[0]] is None]
            if not parts:
                return
        if self.interrupted:
            self._stop(parts)
            return
        try:
            self._execute(parts, whole)
        except Exception as exc:
            if self.interrupted:  # the stop's own failure, or one nobody waits for
                self._stop(parts)
            elif isinstance(exc, OutOfMemory):
                self._out_of_memory(parts, exc)
            elif pinned_on_requests(exc):
                self._bisect(parts, exc)
            else:  # e.g. a runtime's untranslated failure: no request's own fault
                self._fail(parts, exc)

    def _execute(self, parts: list[Part], whole: bool) -> None:
        """Run ``parts`` once; ``whole``: they are the entire batch, every request whole."""
        c0 = time.thread_time_ns() if self._cpu_clock else 0
        t0 = time.monotonic_ns()
        items = [self._batch[index] for index, _, _ in parts]
        rows = [stop - start for _, start, stop in parts]
        loan = None
        if self._lender is not None:
            positions = sum(rows) * max(item.row_positions for item in items)
            loan = self._lender.borrow(positions)
        try:
            arrays = [item.inputs for item in items] if whole else _inputs(items, parts)
            batch_io = self._batch_io
            merged = (
                merge_inputs(arrays, self._pad_value)
                if batch_io is None
                else batch_io.merge(arrays)
            )
            names = self._names if whole else _output_names(items)
            t1 = time.monotonic_ns()
            if loan is not None:
                self._backend.release_after_next_run()
            outputs = self._backend.infer(merged.arrays, names)
            t2 = time.monotonic_ns()
        finally:
            if loan is not None:
                loan.close()
        pieces = (
            split_outputs(outputs, rows)
            if batch_io is None
            else batch_io.split(outputs, arrays, rows)
        )
        self._distribute(parts, items, pieces)
        samples = sum(rows)
        self.largest_ok = max(self.largest_ok, samples)
        t3 = time.monotonic_ns()
        cpu = time.thread_time_ns() - c0 if self._cpu_clock else 0
        stamps = (t0, t1, t2, t3)
        for item in items:
            item.compute_ns = stamps
        self.executions.append(
            Execution(samples, t1 - t0, t2 - t1, t3 - t2, merged.padding, merged.elements, cpu)
        )

    def _distribute(self, parts: list[Part], items: list[WorkItem], pieces: list[Arrays]) -> None:
        """Each request's own outputs (cut back to its length); row ranges kept apart."""
        layout = self._layout
        batch_length = max(item.row_positions for item in items) if layout else 0
        for (index, start, stop), item, piece in zip(parts, items, pieces, strict=True):
            own = {name: piece[name] for name in item.output_names}
            if layout is not None:
                own = layout.trim(own, item.row_positions, batch_length)
            if stop - start == item.batch_size:
                self._outputs[index] = own
            else:
                self._pieces.setdefault(index, []).append(own)

    def _out_of_memory(self, parts: list[Part], exc: OutOfMemory) -> None:
        samples = sum(stop - start for _, start, stop in parts)
        if samples == 1 or (len(parts) == 1 and self._batch_io is not None):
            self._fail(parts, _alone_does_not_fit(exc))
            return
        self.oom_splits += 1
        self.smallest_oom = min(self.smallest_oom or samples, samples)
        for half in _halves(parts):
            self._attempt(half)

    def _stop(self, parts: list[Part]) -> None:
        self.stopped = True
        self._fail(parts, asyncio.CancelledError())

    def _bisect(self, parts: list[Part], exc: BaseException) -> None:
        if len(parts) == 1:  # one request, or rows of one: the failure is its own
            self._fail(parts, exc)
            return
        for half in _halves(parts):
            if self._retries == 0:
                self._fail(half, exc)
            else:
                self._retries -= 1
                self._attempt(half)

    def _fail(self, parts: list[Part], exc: BaseException) -> None:
        self._failed = True
        for index, _, _ in parts:
            if self._errors[index] is None:
                self._errors[index] = exc

    def _outcomes(self) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for index, (outputs, error) in enumerate(zip(self._outputs, self._errors, strict=True)):
            if error is not None:
                outcomes.append(error)
            elif outputs is not None:
                outcomes.append(outputs)
            else:
                outcomes.append(join_rows(self._pieces[index]))
        return outcomes


def _inputs(items: list[WorkItem], parts: list[Part]) -> list[Arrays]:
    """Each part's input rows: the request's own arrays when it runs whole."""
    return [
        item.inputs
        if stop - start == item.batch_size
        else {name: array[start:stop] for name, array in item.inputs.items()}
        for item, (_, start, stop) in zip(items, parts, strict=True)
    ]


def _output_names(items: Sequence[WorkItem]) -> list[str]:
    if len(items) == 1:
        return list(items[0].output_names)
    return sorted({name for item in items for name in item.output_names})


def _halves(parts: list[Part]) -> tuple[list[Part], list[Part]]:
    """Two halves by requests; a lone request's rows split in two."""
    if len(parts) > 1:
        middle = len(parts) // 2
        return parts[:middle], parts[middle:]
    index, start, stop = parts[0]
    middle = (start + stop) // 2
    return [(index, start, middle)], [(index, middle, stop)]


def pinned_on_requests(error: BaseException) -> bool:
    """Whether a failure is one ``BatchRun`` bisects, pinning it on the requests that fail
    alone (a poisoned input), rather than one every request shares (out of memory, unload,
    deadline): a work item made of several clients' requests is then tried client by client."""
    return isinstance(error, (BackendError, InvalidArgument)) and not isinstance(error, OutOfMemory)


def _alone_does_not_fit(exc: OutOfMemory) -> OutOfMemory:
    return OutOfMemory(
        f"{exc.message}; the request does not fit in memory even alone: send fewer samples "
        "(or shorter sequences) per request"
    )
