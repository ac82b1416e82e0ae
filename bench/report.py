"""bench/RESULTS.md: one table per section, then the targets, then notes. Pure formatting."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from bench.records import (
    BATCHSERVE,
    IDENTITY,
    PYTRITON,
    RAW_ASGI,
    CeilingPoint,
    Results,
    SectionLoad,
    ServerPoint,
)
from bench.targets import FLOORS, NAMES, Verdict, bounds, ceiling_of, last_line, rate

BUSY_LOAD = 1.0
BUSY_CPU = 0.1


def render(results: Results, verdicts: Sequence[Verdict]) -> str:
    parts = [
        heading(
            "# Benchmark: in-process ceiling, request floors and batchserve, in one run",
            results,
            "points",
        ),
        loads(results),
        _ceilings(results),
        _floors(results),
        _servers(results, BATCHSERVE, "## (c) batchserve over HTTP and gRPC"),
        _peers(results),
        _targets(verdicts),
        _notes(results),
    ]
    return "\n\n".join(part for part in parts if part) + "\n"


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str) -> str:
    """A Markdown table; ``align`` has one letter per column, l (text) or r (numbers)."""
    if len(align) != len(header):
        raise ValueError(f"align {align!r} does not give one letter per column of {header}")
    rules = ["---:" if letter == "r" else "---" for letter in align]
    lines = [_row(header), _row(rules), *(_row(r) for r in rows)]
    return "\n".join(lines)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def ratio(value: float, base: float | None) -> str:
    if base is None or not base or math.isnan(value) or math.isnan(base):
        return "—"
    return f"{value / base:.2f}"


def ms(microseconds: float) -> str:
    return f"{microseconds / 1000:.2f}"


def heading(title: str, results: Results, fewer: str) -> str:
    """A report's title, the run's machine and versions, its command and duration; a quick
    run (short windows, fewer ``fewer``) is marked as a smoke test."""
    lines = [
        title,
        "",
        *(f"- {line}" for line in results.header),
        f"- Command: `{results.command}`; the run took {results.duration_s / 60:.1f} min.",
    ]
    if results.quick:
        lines += ["", f"**Quick run** (short windows, fewer {fewer}): a smoke test, not a result."]
    return "\n".join(lines)


def loads(results: Results) -> str:
    rows = [
        (s.name, f"{s.before:.2f}", f"{s.after:.2f}", f"{s.busy:.0%}", _warning(s))
        for s in results.sections
    ]
    title = (
        "## Load around each section\n\n"
        "load1 is the 1-minute load average (it still carries the previous section: the run "
        f"waits up to a minute for it to fall to {BUSY_LOAD:g}); CPU busy is the share of all "
        "CPU time in use during one second just before the section, while the benchmark ran "
        "nothing, i.e. other work."
    )
    header = ("section", "load1 before", "load1 after", "CPU busy before", "warning")
    return f"{title}\n\n" + table(header, rows, "lrrrl")


def _warning(s: SectionLoad) -> str:
    found = [f"load1 > {BUSY_LOAD:g}"] if s.before > BUSY_LOAD else []
    if s.busy > BUSY_CPU:
        found.append(f"other work used {s.busy:.0%} of the CPU")
    return "; ".join(found)


def _ceilings(results: Results) -> str:
    models = list(dict.fromkeys(c.model for c in results.ceilings))
    batches = sorted({c.batch for c in results.ceilings})
    rows = []
    for model in models:
        cells = []
        for batch in batches:
            point = results.ceiling(model, batch)
            cells.append(
                f"{rate(point.samples_per_s)} ({point.median_s * 1000:.3f} ms)" if point else "—"
            )
        best = results.best_ceiling(model)
        assert best is not None
        rows.append([model, *cells, f"**{rate(best.samples_per_s)}** (b={best.batch})"])
    header = ["model", *(f"b={b}" for b in batches), "best"]
    title = (
        "## (a) Ceiling: the same ONNX file in-process (ONNX Runtime, CPU EP, default options)\n\n"
        "Samples/s at each batch size (median time per call)."
    )
    text = f"{title}\n\n" + table(header, rows, "l" + "r" * (len(header) - 1))
    beside = [c for c in results.ceilings if c.beside]
    if beside:
        rows = [
            [c.model, NAMES[c.protocol], str(c.round + 1), str(c.batch), rate(c.samples_per_s),
             str(c.calls)]
            for c in beside
        ]  # fmt: skip
        header = ["model", "before the point over", "round", "batch", "samples/s", "calls"]
        text += (
            "\n\nThe same ceiling at the best batch size, taken again right before each round "
            "of the compute-bound model's judged point (its server up and idle):\n\n"
            + table(header, rows, "llrrrr")
        )
    return text


def _floors(results: Results) -> str:
    points = [p for p in results.points if p.model == IDENTITY and p.server != PYTRITON]
    rows = [
        [_floor_label(results, p), NAMES[p.protocol], str(p.concurrency), *_figures(p),
         _mean_batch(p), _cpu(p), ratio(p.throughput, _floor_rate(results, p)), _load(p)]
        for p in points
    ]  # fmt: skip
    header = ("server", "protocol", "c", "infer/s", "p50 ms", "p99 ms", "mean batch",
              "server CPU µs/req", "÷ protocol floor", "load1")  # fmt: skip
    title = (
        "## (b) Floors: the identity model through batchserve, and echo servers\n\n"
        "Echo servers answer with the request's own tensor (no model, no batching); the "
        "protocol floor is aiohttp for HTTP and grpc.aio (uvloop) for gRPC, at the same "
        'concurrency. The echo points "beside" a model were taken right before that model\'s '
        "shipped point at the same concurrency (in each round, where the point was taken in "
        "rounds), and are the floors its ratios and targets use."
    )
    return f"{title}\n\n" + table(header, rows, "llrrrrrrrr")


def _servers(results: Results, server: str, title: str) -> str:
    points = [p for p in results.points if p.server == server and p.model != IDENTITY]
    if not points:
        return ""
    rows = [_server_row(results, p) for p in points]
    header = ("model", "protocol", "batching", "c", "infer/s", "p50 ms", "p99 ms", "queue ms",
              "compute ms", "mean batch", "cap", "server CPU µs/req", "÷ ceiling",
              "÷ protocol floor", "÷ raw ASGI", "load1")  # fmt: skip
    text = (
        "Throughput over the model's best in-process rate (÷ ceiling) and over the echo "
        "floor of the protocol at the same concurrency; queue and compute are "
        "perf_analyzer's server-side columns; mean batch is inferences / executions "
        "counted by the server over the point."
    )
    return f"{title}\n\n{text}\n\n" + table(header, rows, "lll" + "r" * 13)


def _server_row(results: Results, p: ServerPoint) -> list[str]:
    best = ceiling_of(results, p)
    asgi = None
    if p.protocol == "http":
        asgi = results.floor(RAW_ASGI, "http", p.concurrency, _beside(p), p.round)
    queue = ms(p.row.queue_us) if p.row else "—"
    compute = ms(p.row.compute_us) if p.row else "—"
    return [
        p.model, NAMES[p.protocol], p.batching, _concurrency(results, p), *_figures(p), queue,
        compute, _mean_batch(p), str(p.cap or "—"), _cpu(p),
        ratio(p.throughput, best.samples_per_s if best else None),
        ratio(p.throughput, _floor_rate(results, p)),
        ratio(p.throughput, asgi.throughput if asgi else None), _load(p),
    ]  # fmt: skip


def _peers(results: Results) -> str:
    title = "## Peers from the same machine"
    if not any(p.server == PYTRITON for p in results.points):
        return f"{title}\n\n{results.peers_note or 'Peers were not run: no numbers are quoted.'}"
    parts = [_servers(results, PYTRITON, f"{title}\n\n{results.peers_note}")]
    points = [p for p in results.points if p.server == PYTRITON and p.model == IDENTITY]
    if points:
        rows = [[NAMES[p.protocol], str(p.concurrency), *_figures(p)] for p in points]
        header = ("identity on PyTriton", "c", "infer/s", "p50 ms", "p99 ms")
        parts.append(table(header, rows, "lrrrr"))
    return "\n\n".join(parts)


def _targets(verdicts: Sequence[Verdict]) -> str:
    rows = [(v.target, v.measured, f"**{v.label}**") for v in verdicts]
    return "## Targets\n\n" + table(("target", "measured", "result"), rows, "lll")


def _notes(results: Results) -> str:
    notes = list(results.notes)
    busy = [s.name for s in results.sections if _warning(s)]
    if busy:
        notes.append(
            f"The machine was busy before: {', '.join(busy)} (see the load table). Figures "
            "taken while other work shared the cores are lower bounds."
        )
    if any(p.row and not p.row.stable for p in results.points):
        notes.append(
            "Figures marked * did not settle within perf_analyzer's 25 % stability and were "
            "taken again at 100 %."
        )
    notes += _failures(results.points)
    notes += [_role(results, m) for m in results.models()]
    return "## Notes\n\n" + "\n".join(f"- {note}" for note in notes)


def _failures(points: Sequence[ServerPoint]) -> list[str]:
    """One note per distinct error, naming the points it took."""
    by_error: dict[str, list[str]] = {}
    for p in points:
        if p.row is None:
            by_error.setdefault(last_line(p.error), []).append(_label(p))
    return [f"Failed ({', '.join(labels)}): {error}" for error, labels in by_error.items()]


def _role(results: Results, model: str) -> str:
    limits = bounds(results, model)
    if limits is None:
        return f"{model} is not classified: its ceiling or the aiohttp floor is missing."
    ceiling, floor = limits
    kind = "compute-bound" if ceiling < floor else "request-bound"
    return (
        f"{model} is judged {kind}: 0.95 x its ceiling = {rate(ceiling)}/s against 0.6 x the "
        f"aiohttp floor at c=32 = {rate(floor)}/s; the lower one is its target."
    )


def _label(p: ServerPoint) -> str:
    return f"{p.server} {p.model} {NAMES[p.protocol]} c={p.concurrency} {p.batching}".strip()


def _floor_label(results: Results, p: ServerPoint) -> str:
    if not p.beside:
        return p.server
    return f"{p.server}, beside {p.beside}{_round(results, p)}"


def _concurrency(results: Results, p: ServerPoint) -> str:
    return f"{p.concurrency}{_round(results, p)}"


def _round(results: Results, p: ServerPoint) -> str:
    """The label's suffix: ", round k of n" for a point taken in rounds, else nothing."""
    taken = results.rounds(p.server, p.model, p.protocol, p.concurrency, p.batching)
    count = sum(1 for q in taken if q.beside == p.beside)
    return f", round {p.round + 1} of {count}" if count > 1 else ""


def _figures(p: ServerPoint) -> list[str]:
    if p.row is None:
        return ["failed", "—", "—"]
    mark = "" if p.row.stable else "*"
    return [f"{rate(p.row.throughput)}{mark}", ms(p.row.p50_us), ms(p.row.p99_us)]


def _load(p: ServerPoint) -> str:
    return f"{p.load1:.2f}" if p.row else "—"


def _mean_batch(p: ServerPoint) -> str:
    return "—" if math.isnan(p.mean_batch) else f"{p.mean_batch:.1f}"


def _cpu(p: ServerPoint) -> str:
    return "—" if math.isnan(p.cpu_us_per_request) else f"{p.cpu_us_per_request:.0f}"


def _beside(p: ServerPoint) -> str:
    """The model whose own floors a point is compared with: batchserve's models only."""
    return p.model if p.server == BATCHSERVE and p.model != IDENTITY else ""


def _floor_rate(results: Results, p: ServerPoint) -> float | None:
    floor = results.floor(FLOORS[p.protocol], p.protocol, p.concurrency, _beside(p), p.round)
    if floor is None or floor is p or floor.row is None:
        return None
    return floor.throughput


def ceiling_line(point: CeilingPoint) -> str:
    """Progress line for one in-process point."""
    where = f" before {NAMES[point.protocol]} round {point.round + 1}" if point.beside else ""
    return (
        f"  {point.model} b={point.batch}{where}: {rate(point.samples_per_s)} samples/s "
        f"({point.median_s * 1000:.3f} ms, {point.calls} calls)"
    )


def progress_line(p: ServerPoint) -> str:
    """Progress line for one perf_analyzer point."""
    if p.row is None:
        return f"  {_label(p)}: FAILED {last_line(p.error)}"
    return (
        f"  {_label(p)}: {_figures(p)[0]}/s p50 {ms(p.row.p50_us)} ms p99 {ms(p.row.p99_us)} ms"
        f" batch {_mean_batch(p)} cpu {_cpu(p)} µs/req load1 {p.load1:.2f}"
    )
