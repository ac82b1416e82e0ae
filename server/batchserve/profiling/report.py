"""What `batchserve profile` prints on stdout, and the recommended config written or shown."""

from __future__ import annotations

from pathlib import Path

from batchserve.profiling.config_edit import rewrite, write
from batchserve.profiling.plan import Setting, concurrency
from batchserve.profiling.results import DEFAULT_BUDGET_FACTOR, Outcome, choose, notes, table
from batchserve.profiling.sweep import Report, Request


def print_report(request: Request, report: Report, seconds: float) -> Outcome | None:
    """The header, the table and its notes, and the recommendation; returns the chosen row."""
    sweep = "quick sweep" if request.quick else "sweep"
    settings = len({outcome.setting for outcome in report.outcomes})
    print(
        f"{request.model}: {sweep} of {settings} settings over {request.protocol} in "
        f"{seconds:.1f} s (perf_analyzer windows of {request.window.interval_ms} ms)"
    )
    alone = report.alone
    print(
        f"one client, config as it is ({_describe(report.current)}): "
        f"{alone.throughput:.1f} infer/sec, p99 {alone.p99_ms:.2f} ms"
    )
    how = (
        "--latency-budget"
        if request.latency_budget_ms
        else f"{DEFAULT_BUDGET_FACTOR} x the p99 of one client; set it with --latency-budget"
    )
    print(f"p99 latency budget: {report.budget_ms:.2f} ms ({how})\n")
    chosen = choose(report.outcomes, report.budget_ms)
    print(table(report.outcomes, report.budget_ms, chosen))
    for line in notes(report.outcomes):
        print(f"  note: {line}")
    print()
    if chosen is None:
        print(
            f"no setting met the p99 budget of {report.budget_ms:.2f} ms: nothing written "
            "(raise --latency-budget, or sweep fewer clients with --concurrency)"
        )
    else:
        print(_recommendation(chosen, report))
    return chosen


def write_recommendation(setting: Setting, text: str, path: Path | None) -> None:
    """Write the recommended config to ``path`` (keeping the file there), or print it."""
    new_text, layout_kept = rewrite(text, setting)
    if path is None:
        print("recommended config.pbtxt (not written: --dry-run):\n")
        print(new_text, end="")
    else:
        backup = write(path, new_text)
        kept = f"; the file as it was is {backup}" if backup is not None else ""
        print(f"wrote {path}{kept}")
    if not layout_kept:
        print("note: the config was rendered afresh, so its comments and layout are gone")


def _recommendation(chosen: Outcome, report: Report) -> str:
    assert chosen.measurement is not None
    measured = chosen.measurement
    lines = [
        f"recommended: {_describe(chosen.setting)}",
        f"  {measured.throughput:.1f} infer/sec at concurrency {chosen.concurrency}, "
        f"p50 {measured.p50_ms:.2f} ms, p99 {measured.p99_ms:.2f} ms",
    ]
    before = _as_it_was(report)
    if before is not None and before.measurement is not None and before is not chosen:
        lines.append(
            f"  the config as it was: {before.measurement.throughput:.1f} infer/sec at "
            f"concurrency {before.concurrency}, p99 {before.measurement.p99_ms:.2f} ms"
        )
    return "\n".join(lines)


def _as_it_was(report: Report) -> Outcome | None:
    clients = concurrency(report.current)
    rows = [o for o in report.outcomes if o.setting == report.current]
    return next((o for o in rows if o.concurrency == clients), rows[0] if rows else None)


def _describe(setting: Setting) -> str:
    text = f"instance_group count {setting.instances}"
    if setting.max_batch_size == 0:
        return f"{text}, max_batch_size 0 (the model does not batch)"
    return (
        f"{text}, max_batch_size {setting.max_batch_size}, "
        f"max_queue_delay_microseconds {setting.queue_delay_us}"
    )
