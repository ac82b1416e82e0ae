"""Triton's ``--metrics-config <setting>=<value>`` entries, parsed once at start: which
latency families the ``nv_*`` metrics carry.

Triton's settings and defaults (``metric_model_reporter.cc``): ``counter_latencies`` (true:
the cumulative ``*_duration_us`` counters), ``summary_latencies`` (false: the
``*_summary_us`` summaries, quantiles over a sliding window), ``summary_quantiles``
(``<quantile>:<error>,...``) and ``histogram_latencies`` (false: the first-response
histogram ``nv_inference_first_response_histogram_ms``). A setting batchserve does not know
is kept in ``unknown``, for the start-up log, as Triton ignores it; a value it cannot read
is refused at start, where Triton would ignore it too, so a typo does not pass unseen. A
quantile's numbers are read as Triton's ``std::stod`` reads them, from their longest numeric
start (Triton's own L0_metrics passes ``0.1:0.0.1``, which it reads as 0.1 and 0.0), and what
follows that start is noted in ``read_as`` for the start-up log.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
"""Triton's quantiles and their allowed errors."""
_BOOLEANS = ("counter_latencies", "summary_latencies", "histogram_latencies")


@dataclass(frozen=True)
class MetricsConfig:
    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    unknown: tuple[str, ...] = ()
    """Settings given that batchserve does not know (logged at start)."""
    read_as: tuple[str, ...] = ()
    """Numbers read from their numeric start only, as Triton reads them (logged at start)."""


TRITON_DEFAULTS = MetricsConfig()
"""What a server given no ``--metrics-config`` reports: Triton's counters only."""


def parse_metrics_config(entries: Sequence[str]) -> MetricsConfig:
    """Triton's ``<setting>=<value>`` entries; ValueError in Triton's words for a bad one."""
    values: dict[str, object] = {}
    unknown: list[str] = []
    read_as: list[str] = []
    for entry in entries:
        setting, equals, value = entry.partition("=")
        if not equals or not setting or not value or "," in setting:
            raise ValueError(
                f"--metrics-config option format is <setting>=<value>. Got {entry[:64]}"
            )
        if setting in _BOOLEANS:
            values[setting] = _boolean(setting, value)
        elif setting == "summary_quantiles":
            values[setting] = _quantiles(value, read_as)
        else:
            unknown.append(setting[:64])
    return MetricsConfig(
        **values,  # type: ignore[arg-type]
        unknown=tuple(unknown),
        read_as=tuple(read_as),
    )


def _boolean(setting: str, value: str) -> bool:
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise ValueError(f"--metrics-config {setting}: expected true or false, got {value[:32]!r}")
    return word == "true"


def _quantiles(value: str, read_as: list[str]) -> tuple[tuple[float, float], ...]:
    """``<quantile>:<error>,...`` (Triton also takes spaces between pairs); ``read_as`` gets
    each number read from its numeric start only."""
    pairs = []
    for text in value.replace(" ", ",").split(","):
        if not text:
            continue
        quantile, colon, error = text.partition(":")
        read_quantile, read_error = _stod(quantile, read_as), _stod(error, read_as)
        if (
            not colon
            or read_quantile is None
            or read_error is None
            or not 0 <= read_quantile <= 1
            or not 0 <= read_error <= 1
        ):
            raise ValueError(
                f"--metrics-config summary_quantiles: invalid option [{text[:32]}]; expected "
                "<quantile>:<error>, each between 0 and 1"
            )
        pairs.append((read_quantile, read_error))
    if not pairs:
        raise ValueError("--metrics-config summary_quantiles: no <quantile>:<error> pair given")
    return tuple(pairs)


_DECIMAL_START = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _stod(text: str, read_as: list[str]) -> float | None:
    """``text``'s number as C++'s ``std::stod`` reads it: its longest decimal start (None
    where it has none, where stod throws); a start shorter than ``text`` is noted."""
    start = _DECIMAL_START.match(text)
    if start is None:
        return None
    number = float(start.group())
    if start.end() < len(text):
        read_as.append(f"summary_quantiles: '{text[:32]}' read as {number}, as Triton reads it")
    return number
