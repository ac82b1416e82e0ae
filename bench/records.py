"""What one benchmark run measured: plain values, shared by the collectors and the report."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

# Server labels used in the tables and to look up floors.
BATCHSERVE = "batchserve"
AIOHTTP = "aiohttp echo"
RAW_ASGI = "raw ASGI echo"
GRPC_AIO = "grpc.aio echo"
PYTRITON = "PyTriton"
IDENTITY = "identity"


@dataclass(frozen=True)
class CeilingPoint:
    """One batch size of a model called in-process: the median of many timed calls."""

    model: str
    batch: int
    median_s: float
    calls: int
    beside: str = ""  # a model whose server point of ``protocol`` and ``round`` followed it
    protocol: str = ""
    round: int = 0

    @property
    def samples_per_s(self) -> float:
        return self.batch / self.median_s


@dataclass(frozen=True)
class PaRow:
    """perf_analyzer's figures for one point (its CSV row; times in microseconds)."""

    throughput: float
    p50_us: float
    p99_us: float
    queue_us: float
    compute_us: float
    stable: bool = True


@dataclass(frozen=True)
class ServerPoint:
    """One perf_analyzer point against one server, with what the server counted over it.

    Args:
        server: label such as ``BATCHSERVE`` or ``AIOHTTP``.
        batching: "on" or "off" for a model server, "" for an echo server.
        row: perf_analyzer's figures; None when it produced none (see ``error``).
        requests: inferences the server counted over the whole perf_analyzer run.
        executions: model executions (batches) over the same run.
        cpu_s: user + system CPU of the server's process tree over the run.
        load1: the 1-minute load average just before the run.
        cap: the server's batch cap for the model at the end of the run (0: unknown).
        beside: for an echo server's point taken right before a model's point at the same
            concurrency and protocol, that model; "" for the floors section.
        round: which of the paired rounds at a target's point this is (0 when unpaired):
            the model's point and the reference it is judged against alternate, so that
            each ratio compares two windows a few seconds apart.
    """

    server: str
    model: str
    protocol: str
    concurrency: int
    batching: str
    row: PaRow | None
    requests: int = 0
    executions: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    load1: float = 0.0
    cap: int = 0
    error: str = ""
    beside: str = ""
    round: int = 0

    @property
    def mean_batch(self) -> float:
        return self.requests / self.executions if self.executions else math.nan

    @property
    def cpu_us_per_request(self) -> float:
        return 1e6 * self.cpu_s / self.requests if self.requests else math.nan

    @property
    def throughput(self) -> float:
        return self.row.throughput if self.row else math.nan


@dataclass(frozen=True)
class SectionLoad:
    """Load around one section, so a busy machine shows in the results.

    Args:
        before: 1-minute load average at the start (it still carries the previous section).
        after: the same at the end.
        busy: share of all CPU time busy over one second just before the start, while the
            benchmark itself ran nothing: the other work on the machine.
    """

    name: str
    before: float
    after: float
    busy: float = 0.0


@dataclass
class Results:
    """Everything one run measured, in the order the report shows it.

    Args:
        shipped: per model, whether its shipped config batches ("on") or not ("off").
        points: every perf_analyzer point: floors, batchserve and peers alike.
    """

    header: list[str] = field(default_factory=list)
    command: str = ""
    quick: bool = False
    ceilings: list[CeilingPoint] = field(default_factory=list)
    points: list[ServerPoint] = field(default_factory=list)
    shipped: dict[str, str] = field(default_factory=dict)
    sections: list[SectionLoad] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    peers_note: str = ""
    duration_s: float = 0.0

    def ceiling(self, model: str, batch: int) -> CeilingPoint | None:
        """The ceiling section's point (not one taken beside a server round)."""
        found = (c for c in self.ceilings if (c.model, c.batch, c.beside) == (model, batch, ""))
        return next(found, None)

    def best_ceiling(self, model: str) -> CeilingPoint | None:
        points = [c for c in self.ceilings if c.model == model and not c.beside]
        return max(points, key=lambda c: c.samples_per_s, default=None)

    def ceiling_beside(self, model: str, protocol: str, round_: int) -> CeilingPoint | None:
        """The ceiling taken right before ``model``'s ``protocol`` point of round ``round_``."""
        key = (model, protocol, round_)
        return next((c for c in self.ceilings if (c.beside, c.protocol, c.round) == key), None)

    def rounds(
        self, server: str, model: str, protocol: str, concurrency: int, batching: str | None = None
    ) -> list[ServerPoint]:
        """Every round of one point, in order (one element when it was not paired)."""
        key = (server, model, protocol, concurrency)
        return [
            p
            for p in self.points
            if (p.server, p.model, p.protocol, p.concurrency) == key
            and batching in (None, p.batching)
        ]

    def find(
        self, server: str, model: str, protocol: str, concurrency: int, batching: str | None = None
    ) -> ServerPoint | None:
        """The point measured so (``batching`` None: any; its first round), or None."""
        found = self.rounds(server, model, protocol, concurrency, batching)
        return found[0] if found else None

    def floor(
        self, server: str, protocol: str, concurrency: int, beside: str = "", round_: int = 0
    ) -> ServerPoint | None:
        """An echo server's point on the identity model: the one taken beside ``beside``'s
        point of round ``round_`` when there is one (this machine's speed drifts over
        minutes), else the one from the floors section."""
        section = None
        for p in self.rounds(server, IDENTITY, protocol, concurrency):
            if beside and (p.beside, p.round) == (beside, round_):
                return p
            if not p.beside and section is None:
                section = p
        return section

    def models(self, server: str = BATCHSERVE) -> list[str]:
        """Models a server was measured on, in order, the identity floor model excluded."""
        names = (p.model for p in self.points if p.server == server and p.model != IDENTITY)
        return list(dict.fromkeys(names))


def dump(results: Results) -> str:
    """Every figure of a run as JSON, so that its report can be rendered again later."""
    return json.dumps(asdict(results), indent=1, allow_nan=True)


def load(text: str) -> Results:
    """The inverse of ``dump``."""
    raw: dict[str, Any] = json.loads(text)
    ceilings = [CeilingPoint(**c) for c in raw.pop("ceilings")]
    sections = [SectionLoad(**s) for s in raw.pop("sections")]
    points = [
        ServerPoint(**{**p, "row": PaRow(**p["row"]) if p["row"] else None})
        for p in raw.pop("points")
    ]
    return Results(**raw, ceilings=ceilings, sections=sections, points=points)
