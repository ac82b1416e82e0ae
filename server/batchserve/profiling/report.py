"""What `batchserve profile` prints on stdout, and the recommended config written or shown."""

from __future__ import annotations

from pathlib import Path

from batchserve.profiling.config_edit import rewrite, write
from batchserve.profiling.plan import Setting
from batchserve.profiling.results import (
    BUDGET_FACTOR,
    TIE_PERCENT,
    Outcome,
    Repeat,
    choose,
    notes,
    table,
)
from batchserve.profiling.sweep import Report, Request


def print_report(request: Request, report: Report, seconds: float) -> Outcome | None:
    """The header, the table and its notes, and the recommendation; returns the chosen row."""
    sweep = "quick sweep" if request.quick else "sweep"
    count = len({outcome.setting for outcome in report.outcomes})
    settings = f"{count} setting" + ("" if count == 1 else "s")
    print(
        f"{request.model}: {sweep} of {settings} at {_clients(request)} clients over "
        f"{report.protocol} in {seconds:.1f} s (perf_analyzer windows of "
        f"{request.window.interval_ms} ms)"
    )
    if report.requests:
        print(f"requests: {report.requests}")
    first = report.as_it_is
    print(
        f"the config as it is ({_describe(report.current)}), at {first.concurrency} clients: "
        f"{first.throughput:.1f} infer/sec, p50 {first.p50_ms:.2f} ms, p99 {first.p99_ms:.2f} ms"
    )
    if report.fixed:
        print(report.fixed)
    how = (
        "--latency-budget"
        if request.latency_budget_ms
        else f"{BUDGET_FACTOR:g} x the config as it is; set it with --latency-budget"
    )
    print(f"p99 budget: {report.budget_ms:.2f} ms ({how})")
    repeat = _repeat(report)
    print()
    chosen = choose(report.outcomes, report.budget_ms, report.current, repeat)
    print(table(report.outcomes, report.budget_ms, chosen))
    for line in notes(report.outcomes):
        print(f"  note: {line}")
    if chosen is not None and not chosen.meets(report.budget_ms):
        print(
            f"  note: {chosen.setting.label}: within the budget at its first measurement "
            f"(p99 {report.as_it_is.p99_ms:.2f} ms)"
        )
    print()
    if chosen is None and not request.latency_budget_ms:
        chosen = _kept_as_it_is(report)
    if chosen is None:
        print(
            f"no setting met the p99 budget of {report.budget_ms:.2f} ms: nothing written "
            "(raise --latency-budget, or measure longer with --measurement-interval)"
        )
    else:
        print(_recommendation(chosen, report))
    return chosen


def _repeat(report: Report) -> Repeat | None:
    """The config as it is, measured first and again in the sweep at the same clients; a
    spread wider than ``TIE_PERCENT`` is stated, since it widens the tie."""
    again = _as_it_was(report, report.as_it_is.concurrency)
    if again is None or again.measurement is None:
        return None
    repeat = Repeat(report.as_it_is, again.measurement)
    if repeat.noise_percent > TIE_PERCENT:
        print(
            f"noise: the config as it is measured {repeat.first.throughput:.1f} infer/sec first "
            f"and {repeat.again.throughput:.1f} in the sweep, {repeat.noise_percent:.1f} % "
            "apart: a setting replaces it only where it beats the better of the two by more "
            "than that (measure longer with --measurement-interval to tell them apart)"
        )
    return repeat


def _kept_as_it_is(report: Report) -> Outcome:
    """The config as it is, at its first measurement: with the budget derived from that
    measurement, it met the budget there, and a sweep in which no setting did (the same
    setting measured again included) measured a machine busier than the budget allows, not
    a better setting. Without this, `batchserve profile --quick` on a VM shared with other
    work exited 1 (digits_cnn: 8.92 ms at first, 20.23 ms in the sweep)."""
    print(
        f"no setting met the p99 budget of {report.budget_ms:.2f} ms in the sweep, not even the "
        "config as it is measured again: the machine was busier than at its first measurement, "
        "which met it (measure longer with --measurement-interval)"
    )
    return Outcome(report.current, report.as_it_is.concurrency, report.as_it_is)


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


def leave_as_it_is(path: Path) -> None:
    """Say why the model's config is not rewritten: it holds the recommendation already."""
    print(f"{path} is left as it is: it already holds the recommended setting")


def _recommendation(chosen: Outcome, report: Report) -> str:
    assert chosen.measurement is not None
    measured = chosen.measurement
    kept = chosen.setting == report.current
    what = "keep the config as it is" if kept else "recommended"
    lines = [
        f"{what}: {_describe(chosen.setting)}",
        f"  {measured.throughput:.1f} infer/sec at {chosen.concurrency} clients, "
        f"p50 {measured.p50_ms:.2f} ms, p99 {measured.p99_ms:.2f} ms",
    ]
    before = _as_it_was(report, chosen.concurrency)
    if before is not None and before.measurement is not None and not kept:
        lines.append(
            f"  the config as it is, in the sweep: {before.measurement.throughput:.1f} "
            f"infer/sec at {before.concurrency} clients, p99 {before.measurement.p99_ms:.2f} ms"
        )
    return "\n".join(lines)


def _as_it_was(report: Report, clients: int) -> Outcome | None:
    """The current setting's row at ``clients``, where the sweep has one."""
    rows = (o for o in report.outcomes if o.setting == report.current)
    return next((o for o in rows if o.concurrency == clients), None)


def _clients(request: Request) -> str:
    return ", ".join(str(clients) for clients in request.concurrencies)


def _describe(setting: Setting) -> str:
    text = f"instance_group count {setting.instances}"
    if setting.max_batch_size == 0:
        return f"{text}, max_batch_size 0 (the model does not batch)"
    text = f"{text}, max_batch_size {setting.max_batch_size}"
    if setting.queue_delay_us is None:
        return text
    return f"{text}, max_queue_delay_microseconds {setting.queue_delay_us}"
