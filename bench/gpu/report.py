"""bench/GPU_RESULTS.md: one table per part of the check, then the targets. Pure formatting."""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench.gpu import cores
from bench.gpu.records import GpuResults, Key, MemoryReading, PytestRun, Served
from bench.gpu.targets import engine_time_s
from bench.records import ServerPoint
from bench.report import ms, table
from bench.targets import NAMES, Verdict, last_line, rate

MIB = 2**20


def render(results: GpuResults, verdicts: Sequence[Verdict]) -> str:
    parts = [
        _head(results),
        _runtimes(results),
        _phases(results),
        _tests(results.tests),
        _exports(results),
        _accuracy(results),
        _engine(results),
        _served(results),
        _memory(results),
        _cores(results),
        _targets(verdicts, results.mode),
        _notes(results),
    ]
    return "\n\n".join(part for part in parts if part) + "\n"


def _head(results: GpuResults) -> str:
    title = "# GPU check: tests, exports, in-process engines and served models, in one run"
    lines = [title, ""]
    if results.mode == "cpu":
        lines += ["**CPU dry run**: the same harness against the CPU runtimes with a tiny grid. "
                  "It proves the harness; none of its figures is a GPU result.", ""]  # fmt: skip
    lines += [f"- {line}" for line in results.header]
    lines.append(f"- {results.load_tool}")
    lines.append(f"- Command: `{results.command}`; the run took {results.duration_s / 60:.1f} min.")
    if not results.finished:
        lines += ["", f"**Written while the run was under way**, {results.duration_s / 60:.1f} min "
                  "in: the phases below are those it had finished. A run stopped from outside "
                  "leaves this report as its last."]  # fmt: skip
    return "\n".join(lines)


def _runtimes(results: GpuResults) -> str:
    rows = [
        (r.label, r.key, "used" if r.present else "**skipped**", r.version or "—", r.reason or "")
        for r in results.runtimes
    ]
    header = ("runtime", "key", "status", "version", "why skipped")
    return "## Runtimes\n\n" + table(header, rows, "lllll")


def _phases(results: GpuResults) -> str:
    rows = [
        (p.name, f"{p.planned_s:.0f}", f"{p.taken_s:.0f}" if p.taken_s else "—")
        for p in results.phases
    ]
    text = "## Time budget\n\n" + table(("phase", "planned s", "taken s"), rows, "lrr")
    if results.dropped:
        text += "\n\nNot run, to stay within the budget:\n\n"
        text += "\n".join(f"- {label}" for label in results.dropped)
    return text


def _tests(runs: Sequence[PytestRun]) -> str:
    if not runs:
        return "## GPU tests (`pytest -m gpu`)\n\nNot run in this check."
    rows = [
        (r.group, str(r.passed), str(r.failed), str(r.errors), str(r.skipped),
         f"{r.seconds:.0f}", r.note)
        for r in runs
    ]  # fmt: skip
    header = ("tests", "passed", "failed", "errors", "skipped", "s", "note")
    parts = ["## GPU tests (`pytest -m gpu`)", table(header, rows, "lrrrrrl")]
    failures = [f"- {name}: {why}" for r in runs for name, why in r.failures]
    if failures:
        parts.append("Failed or errored:\n\n" + "\n".join(failures))
    skips = [f"- {count} x {reason}" for r in runs for reason, count in r.skips]
    if skips:
        parts.append("Skipped, by reason:\n\n" + "\n".join(skips))
    return "\n\n".join(parts)


def _exports(results: GpuResults) -> str:
    if not results.exports:
        return ""
    rows = [
        (*_key(e.key), "ok" if e.ok else f"**failed**: {e.error}",
         f"{e.seconds:.0f}" if e.seconds else "—", e.summary)
        for e in results.exports
    ]  # fmt: skip
    header = ("model", "runtime", "precision", "result", "s", "exporter's own check")
    title = "## Exports (`batchserve export`, each verified by the exporter before it is written)"
    return f"{title}\n\n" + table(header, rows, "llllrl")


def _key(key: Key) -> tuple[str, str, str]:
    return key.model, key.runtime, key.precision


def _accuracy(results: GpuResults) -> str:
    if not results.accuracy:
        return ""
    rows = [
        (*_key(a.key), a.output, f"{a.max_abs:.3g}", f"{a.max_rel:.3g}",
         "—" if a.top1 is None else f"{a.top1:.0%}")
        for a in results.accuracy
    ]  # fmt: skip
    header = ("model", "runtime", "precision", "output", "max abs error", "max rel error",
              "top-1 agrees")  # fmt: skip
    title = (
        "## Accuracy against the FP32 eager module\n\n"
        "The runtime (in-process, through batchserve's backend) and the FP32 PyTorch module on "
        "the CPU, on the same fixed batch of 8; relative error over the elements of at least "
        "1 % of the output's largest magnitude."
    )
    return f"{title}\n\n" + table(header, rows, "llllrrr")


def _engine(results: GpuResults) -> str:
    keys = list(dict.fromkeys(p.key for p in results.engine))
    if not keys:
        return ""
    batches = sorted({p.batch for p in results.engine})
    rows = []
    for key in keys:
        found = {p.batch: p for p in results.engine_points(key)}
        cells = [
            f"{rate(found[b].samples_per_s)} ({found[b].median_s * 1000:.3f})"
            if b in found
            else "—"
            for b in batches
        ]
        rows.append([*_key(key), *cells])
    header = ["model", "runtime", "precision", *(f"b={b}" for b in batches)]
    title = (
        "## In-process engine (the ceiling)\n\n"
        "Each model through batchserve's backend in this process, graphs off: samples/s at each "
        "batch size, and the median time per batch in ms."
    )
    return f"{title}\n\n" + table(header, rows, "lll" + "r" * len(batches))


def _served(results: GpuResults) -> str:
    if not results.served:
        return ""
    rows = [_served_row(results, s) for s in results.served]
    header = ("model", "runtime", "precision", "batching", "graphs", "protocol", "c", "infer/s",
              "p50 ms", "p99 ms", "mean batch", "cap", "server CPU µs/req",
              "÷ engine at mean batch")  # fmt: skip
    title = (
        "## Served over HTTP and gRPC\n\n"
        "One server per row group (`batchserve serve`, only that model loaded); batch 1 per "
        "request; mean batch is inferences / executions counted by the server over the point."
    )
    return f"{title}\n\n" + table(header, rows, "llllllr" + "r" * 7)


def _served_row(results: GpuResults, s: Served) -> list[str]:
    p = s.point
    v = s.variant
    return [
        *_key(s.key), _flag(v.batching), _flag(v.graphs), NAMES[p.protocol], str(p.concurrency),
        *_figures(p), _mean_batch(p), str(p.cap or "—"), _cpu(p), _vs_engine(results, s),
    ]  # fmt: skip


def _flag(flag: bool) -> str:
    return "on" if flag else "off"


def _figures(p: ServerPoint) -> list[str]:
    if p.row is None:
        return ["failed", "—", "—"]
    mark = "" if p.row.stable else "*"
    return [f"{rate(p.row.throughput)}{mark}", ms(p.row.p50_us), ms(p.row.p99_us)]


def _mean_batch(p: ServerPoint) -> str:
    return "—" if math.isnan(p.mean_batch) else f"{p.mean_batch:.1f}"


def _cpu(p: ServerPoint) -> str:
    return "—" if math.isnan(p.cpu_us_per_request) else f"{p.cpu_us_per_request:.0f}"


def _vs_engine(results: GpuResults, s: Served) -> str:
    batch = s.point.mean_batch
    seconds = engine_time_s(results.engine_points(s.key), batch)
    if seconds is None or s.point.row is None:
        return "—"
    return f"{s.point.throughput * seconds / batch:.2f}"


def _memory(results: GpuResults) -> str:
    if not results.memory:
        return ""
    rows = [_memory_row(m) for m in results.memory]
    header = ("model", "runtime", "precision", "variant", "probe: fixed MiB", "per sample MiB",
              "cap", "reserved MiB", "NVML growth at load MiB", "NVML peak growth MiB",
              "peak ÷ reserved")  # fmt: skip
    title = (
        "## Memory: batchserve's probe against NVML\n\n"
        "The probe's fit (fixed + per sample x batch) of each instance and the reservation at "
        "the cap it chose, from the model's statistics; NVML's device-wide used memory grew "
        "by the next columns from just before the server started: once the model was ready, "
        "and at most while it served (sampled every 0.1 s)."
    )
    return f"{title}\n\n" + table(header, rows, "llll" + "r" * 7)


def _memory_row(m: MemoryReading) -> list[str]:
    fixed = sum(i.fixed_bytes for i in m.instances)
    per_sample = sum(i.per_sample_bytes for i in m.instances)
    cap = ", ".join(str(i.batch_cap) for i in m.instances) or "—"
    loaded = _growth(m.nvml_loaded, m.nvml_before)
    peak = _growth(m.nvml_peak, m.nvml_before)
    share = "—"
    if peak is not None and m.reserved_bytes:
        share = f"{peak / m.reserved_bytes:.2f}"
    return [
        *_key(m.key), m.variant.label, _mib(fixed), _mib(per_sample, 2), cap,
        _mib(m.reserved_bytes), _mib(loaded), _mib(peak), share,
    ]  # fmt: skip


def _growth(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def _mib(value: int | None, digits: int = 0) -> str:
    return "— (no NVML)" if value is None else f"{value / MIB:,.{digits}f}"


def _cores(results: GpuResults) -> str:
    title = (
        f"## Request handling across the machine's cores (`--workers N`, {cores.MODEL})\n\n"
        f"Model: {results.cores_model or cores.MODEL}. "
        f"{cores.CLIENTS_PER_WORKER} clients per request-handling process, batch 1, each gRPC "
        "client on a connection of its own; CPU per request from `/proc` over each point (the "
        "load generator's from its resource usage), divided by the requests the server "
        "counted; machine busy: the share of all the cores' "
        "time busy over the point, the load generator's included (near 100 % the host, not the "
        "server, sets the throughput); requests per frame: the mean group the workers handed "
        "to the model-owning process, whose CPU goes mostly per frame; event loop and busiest "
        "worker busy: the CPU of the model-owning process's event-loop thread and of the "
        "busiest worker over the point's wall time, in cores; bound by: the first of these, "
        f"the one process, the server's, the load generator's or the machine's CPUs busy "
        f"{cores.SATURATED:.0%} or more, else the closed loop's latency (its clients over the "
        "median latency). Scaling: throughput ÷ (N x the one-process throughput over the "
        "same protocol). "
        + (
            f"CPUs: {results.cores_cpus}; server / load busy: the share of each side's CPUs' "
            "time busy over the point (near 100 % on the load generator's, it set the "
            "throughput)."
            if results.cores_cpus
            else "CPUs: the server and the load generator shared every CPU."
        )
    )
    if not results.cores:
        return f"{title}\n\nNot measured: {results.cores_note or 'not run in this check'}."
    rows = []
    for protocol in cores.PROTOCOLS:
        for p, share in cores.scaling(results.cores, protocol):
            rows.append([str(p.workers), NAMES[p.protocol], str(p.concurrency),
                         f"{p.throughput:,.0f}" + ("" if p.stable else " (unstable)"),
                         f"{share:.2f}", f"{p.owner_us:.1f}",
                         f"{p.workers_us:.1f}" if p.workers > 1 else "(one process)",
                         f"{p.load_us:.0f}", f"{p.machine_busy:.0%}",
                         f"{p.per_frame:.1f}" if p.workers > 1 else "—",
                         _sides(p.server_busy, p.load_busy), _share(p.loop_busy),
                         _share(p.busiest_worker), _figure(p.p50_ms, 2),
                         _figure(p.mean_batch, 1), cores.bound(p)])  # fmt: skip
    header = ("workers", "protocol", "concurrency", "throughput (infer/s)", "scaling",
              "model-owning process µs CPU/request", "workers µs CPU/request",
              "load generator µs CPU/request", "machine busy", "requests per frame",
              "server / load busy", "owner's event loop busy", "busiest worker busy",
              "p50 ms", "mean batch", "bound by")  # fmt: skip
    text = f"{title}\n\n" + table(header, rows, "llrrrrrrrrrrrrrl")
    if results.cores_note:
        text += f"\n\nStopped early: {results.cores_note}."
    return text


def _share(cores_busy: float | None) -> str:
    """A thread's or process's CPU over the wall time, in cores ("—" where not read)."""
    return "—" if cores_busy is None else f"{cores_busy:.2f}"


def _figure(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _sides(server: float | None, load: float | None) -> str:
    """Each side's busy share, where each had CPUs of its own."""
    if server is None or load is None:
        return "—"
    return f"{server:.0%} / {load:.0%}"


def _targets(verdicts: Sequence[Verdict], mode: str) -> str:
    rows = [(v.target, v.measured, f"**{v.label}**") for v in verdicts]
    title = "## Targets"
    if mode == "cpu":
        title += "\n\nJudged on the CPU runtimes to prove the judging; not GPU verdicts."
    if not rows:
        return f"{title}\n\nNo runtime was present: nothing to judge."
    return f"{title}\n\n" + table(("target", "measured", "result"), rows, "lll")


def _notes(results: GpuResults) -> str:
    notes = list(results.notes)
    failed = [s for s in results.served if s.point.row is None]
    by_error: dict[str, list[str]] = {}
    for s in failed:
        label = (
            f"{s.key.label} ({s.variant.label}) {NAMES[s.point.protocol]} c={s.point.concurrency}"
        )
        by_error.setdefault(last_line(s.point.error), []).append(label)
    notes += [f"Failed ({', '.join(labels)}): {error}" for error, labels in by_error.items()]
    if any(s.point.row and not s.point.row.stable for s in results.served):
        notes.append("Figures marked * did not settle within perf_analyzer's 25 % stability.")
    if not notes:
        return ""
    return "## Notes\n\n" + "\n".join(f"- {note}" for note in notes)
