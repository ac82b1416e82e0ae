"""Triton's trace settings, global and per model, with tracing itself not built yet.

The settings are kept and answered with Triton's keys and defaults, so Triton clients
and tools that read or reset them work; a level other than OFF is refused, because
batchserve records no traces yet and must not pretend to.
"""

from __future__ import annotations

from collections.abc import Mapping

from batchserve.core.errors import InvalidArgument, Unsupported

# Triton's defaults (tritonserver --trace-rate 1000, --trace-count -1, --log-frequency 0).
DEFAULTS: dict[str, str] = {"trace_rate": "1000", "trace_count": "-1", "log_frequency": "0"}
LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1

# A requested value: None clears the setting (back to the global one, or the default).
Update = Mapping[str, list[str] | None]
Answer = dict[str, list[str] | str]


class TraceSettings:
    """The global settings and each model's own; bounded by the models there are (a
    model's settings can only be set while it is loaded)."""

    def __init__(self) -> None:
        self._global: dict[str, str] = dict(DEFAULTS)
        self._models: dict[str, dict[str, str]] = {}

    def get(self, model: str = "") -> Answer:
        """Triton's answer: level, rate, count, log frequency, file and mode."""
        values = {**self._global, **self._models.get(model, {})}
        return {
            "trace_level": ["OFF"],
            "trace_rate": values["trace_rate"],
            "trace_count": values["trace_count"],
            "log_frequency": values["log_frequency"],
            "trace_file": "",
            "trace_mode": "triton",
        }

    def update(self, updates: Update, model: str = "") -> Answer:
        """Check every key first, then apply them all: a refused request changes nothing."""
        parsed = {key: _parse(key, value) for key, value in updates.items()}
        target = self._models.setdefault(model, {}) if model else self._global
        for key, value in parsed.items():
            if key == "trace_level":
                continue  # only OFF gets here, and OFF is what tracing already is
            if value is not None:
                target[key] = value
            elif model:
                target.pop(key, None)
            else:
                target[key] = DEFAULTS[key]
        return self.get(model)

    def forget(self, model: str) -> None:
        """Drop a model's own settings (it was unloaded)."""
        self._models.pop(model, None)


def json_updates(body: Mapping[str, object]) -> dict[str, list[str] | None]:
    """A JSON request's settings as lists of strings (Triton sends numbers as strings;
    plain JSON numbers are taken too); anything else is refused, naming the key."""
    updates: dict[str, list[str] | None] = {}
    for key, value in body.items():
        if value is None:
            updates[key] = None
        elif isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
            updates[key] = [str(value)]
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            updates[key] = [str(v) for v in value]
        else:
            raise InvalidArgument(
                f"trace setting '{key[:64]}' must be a string, a list of strings or null"
            )
    return updates


def _parse(key: str, value: list[str] | None) -> str | None:
    if key == "trace_level":
        if value is not None:
            _check_level(value)
        return None
    if key == "trace_file":
        raise Unsupported("trace file location can not be updated through network protocol")
    if key == "trace_mode":
        raise InvalidArgument("'trace_mode' can not be updated: batchserve's mode is 'triton'")
    if key not in DEFAULTS:
        known = ", ".join(["trace_level", *DEFAULTS, "trace_file"])
        raise InvalidArgument(f"unknown trace setting '{key[:64]}'; the settings are {known}")
    if value is None:
        return None
    if len(value) != 1:
        raise InvalidArgument(f"expect only 1 value for '{key}'")
    return _number(key, value[0])


def _check_level(levels: list[str]) -> None:
    if not levels:
        raise InvalidArgument("'trace_level' needs a level; to switch tracing off send [\"OFF\"]")
    for level in levels:
        if level not in LEVELS:
            raise InvalidArgument(
                f"unknown trace level '{level[:32]}' in 'trace_level'; Triton's levels are "
                + ", ".join(LEVELS)
            )
    if "OFF" in levels and len(levels) > 1:
        raise InvalidArgument("Expect only one trace level 'OFF' is specified")
    if levels != ["OFF"]:
        raise Unsupported(
            f"trace level {'+'.join(levels) or '[]'} is not available: tracing is not "
            "available in batchserve yet; 'trace_level' can only be [\"OFF\"]"
        )


def _number(key: str, text: str) -> str:
    low, high = (-1, INT32_MAX) if key == "trace_count" else (0, UINT32_MAX)
    stripped = text.strip()
    digits = stripped[1:] if stripped[:1] == "-" else stripped
    if not digits.isascii() or not digits.isdigit() or len(digits) > 12:
        raise InvalidArgument(f"Unable to parse '{key}', got: {text[:32]}")
    number = int(stripped)
    if not low <= number <= high:
        raise InvalidArgument(
            f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {text}"
        )
    return str(number)
