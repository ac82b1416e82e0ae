"""The workers' counts, added to the model-owning process's for the one metrics port.

Each worker sends what its own listeners refused, what grpc core counted of its calls and
the bytes its requests in flight hold (``--max-request-memory``) about once a second
(``worker_process``), and at once when a scrape asks (``WorkerPool
.fresh_counts``), so that a refusal a client has seen is in the next scrape; a worker that
exits keeps its last counts, so the totals only ever grow, as counters must.
"""

from __future__ import annotations

from collections import Counter

from batchserve.dataplane.handoff.frames import Frame
from batchserve.observability.grpc_core_counts import CoreCallCounts
from batchserve.observability.refusals import Protocol, Reason, Refusals

RefusalKey = tuple[Protocol, Reason]


class WorkerCounts(Refusals):
    """This process's refusals plus every worker's, live and gone."""

    def __init__(self, own: Refusals) -> None:
        super().__init__()
        self._own = own
        self._live: dict[int, tuple[Counter[RefusalKey], tuple[int, int, int]]] = {}
        self._held: dict[int, int] = {}
        """Each live worker's bytes of requests in flight, as of its last counts."""
        self._gone_refusals: Counter[RefusalKey] = Counter()
        self._gone_core = (0, 0, 0)

    def count(self, protocol: Protocol, reason: Reason) -> None:
        self._own.count(protocol, reason)

    def update(self, worker: int, frame: Frame) -> None:
        """A worker's ``("n", [(protocol, reason, count)...], (started, succeeded, failed),
        asked, held bytes)``."""
        _, refusals, core, _, held = frame
        counts: Counter[RefusalKey] = Counter(
            {(Protocol(p), Reason(r)): int(n) for p, r, n in refusals}
        )
        self._live[worker] = (counts, (int(core[0]), int(core[1]), int(core[2])))
        self._held[worker] = int(held)

    def retire(self, worker: int) -> None:
        """A worker exited: its last counts stay in the totals."""
        self._held.pop(worker, None)  # a gauge: what a gone worker held is free
        last = self._live.pop(worker, None)
        if last is not None:
            self._gone_refusals.update(last[0])
            self._gone_core = _add(self._gone_core, last[1])

    def snapshot(self) -> dict[RefusalKey, int]:
        total = Counter(self._own.snapshot())
        total.update(self._gone_refusals)
        for counts, _ in self._live.values():
            total.update(counts)
        return dict(total)

    def request_memory_held(self) -> int:
        """Bytes the live workers' requests in flight hold, as of their last counts."""
        return sum(self._held.values())

    def grpc_core(self) -> CoreCallCounts:
        """Calls on the shared gRPC port, as the workers' grpc cores counted them."""
        total = self._gone_core
        for _, core in self._live.values():
            total = _add(total, core)
        return CoreCallCounts(*total)


def _add(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def counts_frame(
    refusals: Refusals, core: CoreCallCounts | None, asked: int = -1, held: int = 0
) -> Frame:
    """What a worker sends: its refusals and its grpc core's counts so far, and the bytes its
    requests in flight hold now; ``asked``: the model-owning process's question it answers
    (-1: the periodic report)."""
    rows = [(str(p), str(r), n) for (p, r), n in refusals.snapshot().items()]
    cells = (0, 0, 0) if core is None else (core.started, core.succeeded, core.failed)
    return ("n", rows, cells, asked, held)
