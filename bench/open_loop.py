"""Open-loop load: requests sent at Poisson times whether or not earlier ones have answered,
each one's latency kept; and the share and goodput within a latency objective.

The schedule is drawn here (seeded, so every config gets the same one) and played by NVIDIA's
perf_analyzer in asynchronous mode from ``--request-intervals`` (gRPC, batch 1 per request),
its per-request send and answer times read back from ``--profile-export-file``. In its
default synchronous mode perf_analyzer's request-rate load is not open-loop: each of its
threads (4 by default) waits for its answer, and at 3,000 requests/s on the 2-core machine
95 % of the requests left late. Asynchronously it kept to the schedule (2.6 % late at
4,000/s, the schedule's offsets kept within a millisecond), where one Python process on
grpc.aio fell hundreds of milliseconds behind: perf_analyzer's C++ costs the server's
cores less. perf_analyzer stops at the first failed request, so every request must be
answered (a model refusing late requests cannot be measured this way).
"""

from __future__ import annotations

import json
import math
import random
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import perf_analyzer

WINDOWS = 3
"""perf_analyzer's measurement windows, run for as long as they last: the schedule's first
window's length is the warm-up, the rest is judged (``judged_span``)."""


class Stopped(RuntimeError):
    """perf_analyzer stopped before the end: a request failed (a full queue refuses) or it
    wrote no export; the message is its output's tail."""


@dataclass(frozen=True)
class Sample:
    """One request: when it was due and sent (s from the first send), how long its answer
    took (s, from the send; NaN without one)."""

    due_s: float
    sent_s: float
    latency_s: float

    @property
    def lag_s(self) -> float:
        return self.sent_s - self.due_s


@dataclass(frozen=True)
class Figures:
    """The requests due in one measured span, judged against one objective.

    Args:
        requests: requests due in the span (the offered load).
        within: answered within the objective.
        failed: not answered (or never sent).
        seconds: the span's length.
        sent: of the requests, those perf_analyzer sent before the span ended (None in runs
            judged before: those counted were the ones sent in it).
    """

    requests: int
    within: int
    failed: int
    seconds: float
    p50_ms: float
    p99_ms: float
    lag_p99_ms: float
    sent: int | None = None

    @property
    def share(self) -> float:
        """Share of the offered requests answered within the objective."""
        return self.within / self.requests if self.requests else math.nan

    @property
    def goodput(self) -> float:
        """Requests per second answered within the objective."""
        return self.within / self.seconds if self.seconds else math.nan

    @property
    def offered(self) -> float:
        return self.requests / self.seconds if self.seconds else math.nan

    @property
    def sent_rate(self) -> float:
        """Requests per second perf_analyzer sent of those due: below ``offered`` when it
        fell behind the schedule (an overloaded server holds its sends back)."""
        sent = self.requests if self.sent is None else self.sent
        return sent / self.seconds if self.seconds else math.nan


def poisson_schedule(rate: float, seconds: float, seed: int) -> list[float]:
    """Send times (s from the start) of a Poisson process of ``rate`` per second, up to
    ``seconds``: independent exponential gaps of mean 1/rate."""
    rng = random.Random(seed)
    times: list[float] = []
    at = rng.expovariate(rate)
    while at < seconds:
        times.append(at)
        at += rng.expovariate(rate)
    return times


def intervals_us(times: Sequence[float]) -> list[int]:
    """perf_analyzer's ``--request-intervals``: microseconds from each send to the next (the
    first from the start), at least 1."""
    previous, found = 0, []
    for at in times:
        due = round(at * 1e6)
        found.append(max(1, due - previous))
        previous += found[-1]
    return found


def judged_span(window_s: float) -> tuple[float, float]:
    """The span of the schedule judged (s from its first request): the requests due after
    one window of warm-up, up to ``WINDOWS`` windows. Judged by when they were due, every
    config given a schedule is judged on the very same requests; perf_analyzer's own windows
    run a little longer than asked, by a different amount each run (2.400-2.406 s for 2 s),
    so the requests sent inside them differed by a few, and two configs that answered all
    of them within the objective could differ in goodput."""
    return window_s, WINDOWS * window_s


def judge(samples: Sequence[Sample], objective_s: float, start_s: float, end_s: float) -> Figures:
    """The figures of the requests due in ``[start_s, end_s)``; one without an answer (or
    never sent) counts as offered and not within the objective, and is not in the
    percentiles."""
    due = [s for s in samples if start_s <= s.due_s < end_s]
    answered = [s.latency_s for s in due if not math.isnan(s.latency_s)]
    lags = [s.lag_s for s in due if not math.isnan(s.sent_s)]
    return Figures(
        requests=len(due),
        within=sum(1 for latency in answered if latency <= objective_s),
        failed=len(due) - len(answered),
        seconds=end_s - start_s,
        p50_ms=_percentile_ms(answered, 50),
        p99_ms=_percentile_ms(answered, 99),
        lag_p99_ms=_percentile_ms(lags, 99),
        sent=sum(1 for s in due if s.sent_s < end_s),  # NaN, never sent: False
    )


def unanswered(due: Sequence[float], start_s: float, end_s: float) -> Figures:
    """The figures of a run that stopped: every request the schedule ``due`` has in
    ``[start_s, end_s)`` (s from its first) offered, none sent or answered."""
    return judge(_never_sent(due), math.inf, start_s, end_s)


def _never_sent(due: Sequence[float]) -> list[Sample]:
    """A sample for each time of ``due`` (s from its first), with no send and no answer."""
    return [Sample(at - due[0], math.nan, math.nan) for at in due]


def _percentile_ms(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else math.nan


def samples_from_export(export: dict[str, Any], due: Sequence[float]) -> list[Sample]:
    """Each request of perf_analyzer's profile export, in send order, the k-th sent taken as
    the k-th due (times in s from the first send and the first due); then each request due
    that was never sent (the run ended first), with no send time and no answer."""
    experiment = export["experiments"][0]
    requests = sorted(experiment["requests"], key=lambda r: r["timestamp"])
    nan = math.nan
    if not requests:
        return _never_sent(due)
    first = requests[0]["timestamp"]
    samples = []
    for k, request in enumerate(requests):
        answers = request["response_timestamps"]
        latency = (answers[0] - request["timestamp"]) / 1e9 if answers else nan
        due_s = due[k] - due[0] if k < len(due) else nan  # past the schedule: played again
        samples.append(Sample(due_s, (request["timestamp"] - first) / 1e9, latency))
    samples.extend(_never_sent(due)[len(requests) :])  # due, but the run ended first
    return samples


def play(url: str, model: str, due: Sequence[float], window_s: float, work: Path) -> list[Sample]:
    """Send one request at each time of ``due`` through perf_analyzer, for ``WINDOWS``
    windows of ``window_s``; a sample for each request."""
    schedule = work / "intervals.txt"
    schedule.write_text("".join(f"{gap}\n" for gap in intervals_us(due)))
    export = work / "export.json"
    export.unlink(missing_ok=True)
    argv = [
        perf_analyzer(),
        "-m",
        model,
        "-u",
        url,
        "-i",
        "grpc",
        "-b",
        "1",
        "-a",
        "--request-intervals",
        str(schedule),
        "--measurement-interval",
        str(round(window_s * 1000)),
        "--stability-percentage",
        "100",
        "--max-trials",
        str(WINDOWS),
        "--profile-export-file",
        str(export),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60 + 10 * window_s)
    if done.returncode != 0 or not export.exists():
        raise Stopped((done.stdout + done.stderr)[-1500:])
    with export.open() as handle:
        found = samples_from_export(json.load(handle), due)
    export.unlink()
    return found
