"""Stopping a running batch whose clients have all gone away.

Once started, a batch used to run to its end: a client that left (an HTTP disconnect, a
cancelled gRPC call, a worker's request cancelled) freed nothing until then. For a large
request (a 2048 x 2048 image on a loan, a long sequence) that is seconds of an instance,
and of memory lent to it, spent on an answer nobody reads. While batches run, the watch
looks at them every ``CHECK_EVERY_S`` and stops a batch none of whose requests is waited
for any more (``BatchRun.interrupt``: ONNX Runtime ends the run between two nodes; torch
and TensorRT cannot stop a run, which then runs on). It costs one timer a period while
batches run, nothing per batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from batchserve.scheduler.execution import BatchRun
from batchserve.scheduler.work import WorkItem

CHECK_EVERY_S = 0.1
"""How often running batches are looked at: a stopped run frees its instance within about
this much after its last client left, and a batch shorter than it is never looked at."""


class RunWatch:
    """The batches running on one model's instances, looked at while there are any.

    On the event loop's own timer, not the batcher's clock: the watch keeps no time of its
    own. Its timer is left to fire once after the last batch ends rather than cancelled: a
    model under load would otherwise set and cancel one per batch."""

    def __init__(self) -> None:
        self._runs: dict[BatchRun, Sequence[WorkItem]] = {}
        self._armed = False

    def started(self, run: BatchRun, batch: Sequence[WorkItem]) -> None:
        """``run`` of ``batch`` went to its instance's thread."""
        self._runs[run] = batch
        if not self._armed:
            self._armed = True
            asyncio.get_running_loop().call_later(CHECK_EVERY_S, self._check)

    def finished(self, run: BatchRun) -> None:
        self._runs.pop(run, None)

    def _check(self) -> None:
        for run, batch in self._runs.items():
            if all(item.abandoned() for item in batch):
                run.interrupt()  # again each period: a stop as a run began may miss it
        self._armed = bool(self._runs)
        if self._armed:
            asyncio.get_running_loop().call_later(CHECK_EVERY_S, self._check)
