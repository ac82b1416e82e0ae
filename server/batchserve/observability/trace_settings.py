"""Triton's trace settings, global and per model, and the sampling they ask for.

The settings are kept and answered with Triton's keys and defaults, so Triton clients and
tools that read or set them work. A level other than OFF switches tracing on (the traces are
built by ``tracing.py``); ``trace_rate`` traces every N-th request and ``trace_count`` is
the number of traces still to take (-1: no end), counted down as Triton counts it. In the
``opentelemetry`` mode a request that carries its caller's trace context is traced whatever
the rate and count say, as in Triton. In the ``triton`` mode ``log_frequency`` says how many
traces go to each indexed trace file (``trace_files.py``); the OpenTelemetry mode answers
neither it nor the file, as Triton does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from batchserve.core.errors import InvalidArgument, Unsupported
from batchserve.core.trace_config import (
    LEVELS,
    NO_FILE,
    OPENTELEMETRY,
    TRITON,
    TraceConfig,
    sdk_missing,
)

# Triton's defaults (tritonserver --trace-rate 1000, --trace-count -1, --log-frequency 0).
DEFAULTS: dict[str, str] = {
    "trace_level": "OFF",
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
}
UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1

# A requested value: None clears the setting (back to the global one, or the default).
Update = Mapping[str, list[str] | None]
Answer = dict[str, list[str] | str]
Snapshot = tuple[dict[str, str], dict[str, dict[str, str]]]
"""The global settings and each model's own, as a server sends them to its workers."""


class Sample(NamedTuple):
    """A request the settings trace: at which levels, under which settings (a model with
    settings of its own, or "" for the global ones), and the log frequency they say."""

    levels: str
    scope: str
    log_frequency: int


class TraceSettings:
    """The global settings and each model's own; bounded by the models there are (a
    model's settings can only be set while it is loaded).

    ``enabled`` is the one thing a request reads while tracing is off."""

    def __init__(self, config: TraceConfig | None = None) -> None:
        start = config or TraceConfig()
        self.mode = start.mode
        self.file = start.file
        self._defaults = {
            **DEFAULTS,
            "trace_level": start.level,
            "trace_rate": str(start.rate),
            "trace_count": str(start.count),
            "log_frequency": str(start.log_frequency),
        }
        self._global: dict[str, str] = dict(self._defaults)
        self._models: dict[str, dict[str, str]] = {}
        self._seen: dict[str, int] = {}  # requests seen since each scope was last set
        self._followers: list[Callable[[Snapshot], None]] = []
        self._on_taken: Callable[[str], None] | None = None
        self._on_counted: Callable[[str, bool], None] | None = None
        self._on_reset: Callable[[str | None], None] | None = None
        self.enabled = self._global["trace_level"] != "OFF"

    def get(self, model: str = "") -> Answer:
        """Triton's answer: level, rate, count, (``triton`` mode) log frequency and file,
        and mode."""
        values = {**self._global, **self._models.get(model, {})}
        answer: Answer = {
            "trace_level": values["trace_level"].split(","),
            "trace_rate": values["trace_rate"],
            "trace_count": values["trace_count"],
        }
        if self.mode == TRITON:
            answer["log_frequency"] = values["log_frequency"]
            answer["trace_file"] = self.file
        answer["trace_mode"] = self.mode
        return answer

    def update(self, updates: Update, model: str = "") -> Answer:
        """Check every key first, then apply them all: a refused request changes nothing.
        Sampling starts again for what changed, as Triton's new settings object does."""
        parsed = {key: _parse(key, value) for key, value in updates.items()}
        if parsed.get("trace_level") not in (None, "OFF"):
            self._can_trace()
        target = self._models.setdefault(model, {}) if model else self._global
        for key, value in parsed.items():
            if value is not None:
                target[key] = value
            elif model:
                target.pop(key, None)
            else:
                target[key] = self._defaults[key]
        if model:
            self._seen.pop(model, None)
        else:
            self._seen.clear()
        self._reset(model or None)
        self._changed()
        return self.get(model)

    def _can_trace(self) -> None:
        """A level other than OFF needs somewhere to go: Triton's words where its trace mode
        has no file; the SDK's absence said at once, not on every traced request."""
        if self.mode == TRITON and not self.file:
            raise InvalidArgument(f"Attempting to set invalid trace setting :{NO_FILE}")
        if self.mode == OPENTELEMETRY and (missing := sdk_missing()) is not None:
            raise Unsupported(missing)

    def forget(self, model: str) -> None:
        """Drop a model's own settings (it was unloaded)."""
        if self._models.pop(model, None) is not None:
            self._seen.pop(model, None)
            self._reset(model)
            self._changed()

    def on_counted(self, counted: Callable[[str, bool], None]) -> None:
        """Call ``counted(scope, last)`` for each trace taken from a count here (a worker's
        too, through ``taken``), ``scope`` the settings it is written under; ``last``: it
        took the count to 0 with every request traced (rate 1), where Triton writes what it
        collected to an indexed file at once."""
        self._on_counted = counted

    def on_reset(self, reset: Callable[[str | None], None]) -> None:
        """Call ``reset(scope)`` when a scope's settings are set again (None: the global
        ones, and with them every model's): Triton writes what they collected then."""
        self._on_reset = reset

    def _reset(self, scope: str | None) -> None:
        if self._on_reset is not None:
            self._on_reset(scope)

    def sample(self, model: str, propagated: bool) -> Sample | None:
        """How to trace this request, or None. Called only while ``enabled``.

        ``propagated``: the caller sent a sampled trace context, traced whatever the rate
        and count say. A model with settings of its own counts its requests apart."""
        own = self._models.get(model)
        values = {**self._global, **own} if own else self._global
        level = values["trace_level"]
        if level == "OFF":
            return None
        scope = model if own else ""
        sample = Sample(level, scope, int(values["log_frequency"]))
        if propagated:
            return sample
        counted = own if own and "trace_count" in own else self._global
        left = int(counted["trace_count"])
        rate = int(values["trace_rate"])
        if left == 0 or rate == 0:  # rate 0: only requests that carry a trace context
            return None
        seen = self._seen.get(scope, 0) + 1
        self._seen[scope] = seen
        if seen % rate:
            return None
        if left > 0:
            counted["trace_count"] = str(left - 1)
            taken_from = model if counted is own else ""
            if self._on_taken is not None:
                self._on_taken(taken_from)
            if self._on_counted is not None:
                self._on_counted(scope, left == 1 and rate == 1)  # where its trace goes
        return sample

    def on_taken(self, report: Callable[[str], None]) -> None:
        """Call ``report`` with the scope (a model, or "" for the global settings) of each
        trace taken from a count: a worker tells the model-owning process (``taken``)."""
        self._on_taken = report

    def taken(self, scope: str) -> None:
        """A worker took a trace from ``scope``'s count. The count here is the one clients
        read; once it reaches 0 every worker is told, so that together they take what was
        asked for (each takes from its own copy meanwhile: at most the traces in flight
        between the two processes more)."""
        counted = self._models.get(scope) if scope else self._global
        if counted is None or "trace_count" not in counted:
            return  # the settings changed since: sampling started again
        left = int(counted["trace_count"])
        if left > 0:
            counted["trace_count"] = str(left - 1)
            if self._on_counted is not None:
                values = {**self._global, **self._models.get(scope, {})}
                self._on_counted(scope, left == 1 and values["trace_rate"] == "1")
            if left == 1:
                self._changed()

    def follow(self, follower: Callable[[Snapshot], None]) -> None:
        """Call ``follower`` with the settings after every change: the workers of a server
        sample their own requests by the settings clients set through it."""
        self._followers.append(follower)

    def snapshot(self) -> Snapshot:
        return dict(self._global), {name: dict(own) for name, own in self._models.items()}

    def restore(self, snapshot: Snapshot) -> None:
        """Take the settings a server sent (a worker's copy)."""
        self._global = dict(snapshot[0])
        self._models = {name: dict(own) for name, own in snapshot[1].items()}
        self._seen.clear()
        self._changed()

    def _changed(self) -> None:
        levels = [self._global["trace_level"]]
        levels += [own["trace_level"] for own in self._models.values() if "trace_level" in own]
        self.enabled = any(level != "OFF" for level in levels)
        if self._followers:
            snapshot = self.snapshot()
            for follower in self._followers:
                follower(snapshot)


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
        return None if value is None else _level(value)
    if key == "trace_file":
        raise Unsupported("trace file location can not be updated through network protocol")
    if key == "trace_mode":
        raise InvalidArgument("'trace_mode' can not be updated: it is set at start")
    if key not in DEFAULTS:
        known = ", ".join([*DEFAULTS, "trace_file"])
        raise InvalidArgument(f"unknown trace setting '{key[:64]}'; the settings are {known}")
    if value is None:
        return None
    if len(value) != 1:
        raise InvalidArgument(f"expect only 1 value for '{key}'")
    return _number(key, value[0])


def _level(levels: list[str]) -> str:
    """Triton's checks and words; TIMESTAMPS and TENSORS add up (TENSORS adds the tensors:
    in the ``triton`` mode with their data, as spans without it)."""
    if not levels:
        raise InvalidArgument("'trace_level' needs a level; to switch tracing off send [\"OFF\"]")
    for level in levels:
        if level not in LEVELS:
            raise InvalidArgument(
                f"unknown trace level '{level[:32]}' in 'trace_level'; Triton's levels are "
                + ", ".join(LEVELS)
            )
    if "OFF" in levels:
        if len(levels) > 1:
            raise InvalidArgument("Expect only one trace level 'OFF' is specified")
        return "OFF"
    return ",".join(level for level in LEVELS[1:] if level in levels)


def _number(key: str, text: str) -> str:
    """Triton's checks and texts: not a number; past the type's range (however many
    digits); a count below -1, which has its own."""
    low, high = (-1, INT32_MAX) if key == "trace_count" else (0, UINT32_MAX)
    stripped = text.strip()
    digits = stripped[1:] if stripped[:1] == "-" else stripped
    if not digits.isascii() or not digits.isdigit():
        raise InvalidArgument(f"Unable to parse '{key}', got: {text[:32]}")
    number = int(stripped) if len(digits) <= 12 else None  # 13 digits are past every range
    if number is not None and key == "trace_count" and number < low:
        raise InvalidArgument(
            f"Unable to parse 'trace_count'. Expecting value >= {low}, got:{text[:32]}"
        )
    if number is None or not low <= number <= high:
        raise InvalidArgument(
            f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {text[:32]}"
        )
    return str(number)
