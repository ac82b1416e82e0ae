"""Triton's ``--trace-config`` entries, parsed once at start: the global trace settings a
server starts with (``level=``, ``rate=``, ``count=``, ``mode=``), where its ``triton`` mode
writes trace files (``triton,file=``, ``triton,log-frequency=``) and where its
``opentelemetry`` mode sends spans (``opentelemetry,url=``, ``resource=`` and the batch span
processor's sizes).

The mode: ``mode=`` where given; else ``triton`` where a ``triton,`` setting is (a file to
write), else ``opentelemetry``. Triton's default mode is ``triton`` even without a file, where
it can trace nothing; batchserve keeps the mode that can trace.

Pure parsing: ``Settings`` refuses a bad entry before the server starts, and tracing reads
the result (``observability/tracing.py``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
ALIASES = {"FALSE": "OFF", "ON": "TIMESTAMPS", "TRUE": "TIMESTAMPS", "MIN": "TIMESTAMPS",
           "MAX": "TIMESTAMPS"}  # fmt: skip
"""Triton's older level words (``--trace-level=MIN`` in its QA), read as it reads them."""
TRITON = "triton"
OPENTELEMETRY = "opentelemetry"
MODES = (TRITON, OPENTELEMETRY)
NO_FILE = "trace file name is not given"
"""Triton's reason a ``triton`` mode setting without a file cannot trace."""
UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1
BATCH_KEYS = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")
"""Triton's batch span processor settings (queue size, delay in ms, export batch size)."""


@dataclass(frozen=True)
class TraceConfig:
    """What ``--trace-config`` said; empty fields keep Triton's defaults or the standard
    ``OTEL_*`` environment variables."""

    level: str = "OFF"
    """``OFF``, or the levels to trace joined by ``,`` (``TIMESTAMPS,TENSORS``)."""
    rate: int = 1000
    count: int = -1
    url: str | None = None
    resource: dict[str, str] = field(default_factory=dict)
    batch: dict[str, int] = field(default_factory=dict)
    mode: str = OPENTELEMETRY
    file: str = ""
    """``triton`` mode: the trace file, as given (relative to the server's directory)."""
    log_frequency: int = 0
    """``triton`` mode: write every N traces to the next indexed file; 0: to the file."""


def parse_trace_config(entries: Sequence[str]) -> TraceConfig:
    """Triton's ``[<mode>,]<setting>=<value>`` entries; ValueError names a bad one."""
    parts: dict[str, Any] = {"levels": [], "resource": {}, "batch": {}, "given": set()}
    for entry in entries:
        head, equals, value = entry.partition("=")
        mode, _, key = head.rpartition(",")
        if not equals:
            raise ValueError(f"--trace-config {entry[:64]!r}: expected <setting>=<value>")
        if mode == "":
            _global_entry(parts, entry, key, value)
        elif mode.lower() == OPENTELEMETRY:
            _opentelemetry_entry(parts, entry, key, value)
            parts["given"].add(OPENTELEMETRY)
        elif mode.lower() == TRITON:
            _triton_entry(parts, entry, key, value)
            parts["given"].add(TRITON)
        else:
            raise ValueError(f"--trace-config {entry[:64]!r}: the modes are {' and '.join(MODES)}")
    level = _joined(parts["levels"])
    mode = parts.get("mode") or (TRITON if TRITON in parts["given"] else OPENTELEMETRY)
    if mode == TRITON and level != "OFF" and not parts.get("file"):
        raise ValueError(
            f"--trace-config mode=triton at level {level}: {NO_FILE} (triton,file=<path>)"
        )
    if mode == OPENTELEMETRY and level != "OFF" and (missing := sdk_missing()) is not None:
        raise ValueError(missing)
    return TraceConfig(
        level, parts.get("rate", 1000), parts.get("count", -1),
        parts.get("url"), parts["resource"], parts["batch"],
        mode, parts.get("file", ""), parts.get("log_frequency", 0),
    )  # fmt: skip


def _global_entry(parts: dict[str, Any], entry: str, key: str, value: str) -> None:
    if key == "level":
        parts["levels"].append(_level(entry, value))
    elif key == "rate":
        parts["rate"] = _number(entry, value, 0, UINT32_MAX)
    elif key == "count":
        parts["count"] = _number(entry, value, -1, INT32_MAX)
    elif key == "mode":
        if value.lower() not in MODES:
            raise ValueError(f"--trace-config {entry[:64]!r}: the modes are {' and '.join(MODES)}")
        parts["mode"] = value.lower()
    else:
        raise ValueError(
            f"--trace-config {entry[:64]!r}: the global settings are level, rate, count and mode"
        )


def _opentelemetry_entry(parts: dict[str, Any], entry: str, key: str, value: str) -> None:
    if key == "url":
        parts["url"] = value if "://" in value else f"http://{value}"
    elif key == "resource":
        name, is_pair, attribute = value.partition("=")
        if not is_pair or not name:
            raise ValueError(f"--trace-config {entry[:64]!r}: expected resource=<key>=<value>")
        parts["resource"][name] = attribute
    elif key in BATCH_KEYS:
        parts["batch"][key] = _number(entry, value, 1, INT32_MAX)
    else:
        raise ValueError(
            f"--trace-config {entry[:64]!r}: the opentelemetry settings are url, resource "
            f"and {', '.join(BATCH_KEYS)}"
        )


def _triton_entry(parts: dict[str, Any], entry: str, key: str, value: str) -> None:
    if key == "file":
        if not value:
            raise ValueError(f"--trace-config {entry[:64]!r}: the file needs a path")
        parts["file"] = value
    elif key == "log-frequency":
        parts["log_frequency"] = _number(entry, value, 0, UINT32_MAX)
    else:
        raise ValueError(
            f"--trace-config {entry[:64]!r}: the triton settings are file and log-frequency"
        )


def sdk_missing() -> str | None:
    """Why tracing cannot switch on here, or None: the SDK is the ``tracing`` extra, and a
    level refused at once beats every traced request failing."""
    if importlib.util.find_spec("opentelemetry.sdk") is None or (
        importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None
    ):
        return (
            "tracing needs the OpenTelemetry SDK and OTLP/HTTP exporter, which are not "
            "installed: pip install 'batchserve[tracing]'"
        )
    return None


def _level(entry: str, value: str) -> str:
    level = ALIASES.get(value.upper(), value.upper())
    if level not in LEVELS:
        raise ValueError(f"--trace-config {entry[:64]!r}: the levels are {', '.join(LEVELS)}")
    return level


def _joined(levels: list[str]) -> str:
    """Triton's rule: OFF alone switches tracing off; the other levels add up."""
    chosen = [level for level in LEVELS[1:] if level in levels]
    return ",".join(chosen) if chosen and "OFF" not in levels else "OFF"


def _number(entry: str, text: str, low: int, high: int) -> int:
    stripped = text.strip()
    digits = stripped.removeprefix("-")
    if not digits.isascii() or not digits.isdigit() or len(digits) > 12:
        raise ValueError(f"--trace-config {entry[:64]!r}: not a whole number")
    number = int(stripped)
    if not low <= number <= high:
        raise ValueError(f"--trace-config {entry[:64]!r}: outside [{low}, {high}]")
    return number
