"""Triton's ``--trace-config`` entries, parsed once at start: the global trace settings a
server starts with (``level=``, ``rate=``, ``count=``, ``mode=``) and where its OpenTelemetry
spans go (``opentelemetry,url=``, ``resource=`` and the batch span processor's sizes).

Pure parsing: ``Settings`` refuses a bad entry before the server starts, and tracing reads
the result (``observability/tracing.py``). batchserve traces in Triton's ``opentelemetry``
mode only: its ``triton`` mode writes JSON trace files, which batchserve does not.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODE = "opentelemetry"
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


def parse_trace_config(entries: Sequence[str]) -> TraceConfig:
    """Triton's ``[<mode>,]<setting>=<value>`` entries; ValueError names a bad one."""
    parts: dict[str, Any] = {"levels": [], "resource": {}, "batch": {}}
    for entry in entries:
        head, equals, value = entry.partition("=")
        mode, _, key = head.rpartition(",")
        if not equals:
            raise ValueError(f"--trace-config {entry[:64]!r}: expected <setting>=<value>")
        if mode == "":
            _global_entry(parts, entry, key, value)
        elif mode == MODE:
            _opentelemetry_entry(parts, entry, key, value)
        else:
            raise ValueError(
                f"--trace-config {entry[:64]!r}: batchserve traces in mode {MODE} only "
                "(Triton's triton mode writes trace files, which batchserve does not)"
            )
    level = _joined(parts["levels"])
    if level != "OFF" and (missing := sdk_missing()) is not None:
        raise ValueError(missing)
    return TraceConfig(
        level, parts.get("rate", 1000), parts.get("count", -1),
        parts.get("url"), parts["resource"], parts["batch"],
    )  # fmt: skip


def _global_entry(parts: dict[str, Any], entry: str, key: str, value: str) -> None:
    if key == "level":
        parts["levels"].append(_level(entry, value))
    elif key == "rate":
        parts["rate"] = _number(entry, value, 0, UINT32_MAX)
    elif key == "count":
        parts["count"] = _number(entry, value, -1, INT32_MAX)
    elif key == "mode":
        if value != MODE:
            raise ValueError(f"--trace-config {entry[:64]!r}: batchserve's mode is {MODE}")
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
    if value.upper() not in LEVELS:
        raise ValueError(f"--trace-config {entry[:64]!r}: the levels are {', '.join(LEVELS)}")
    return value.upper()


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
