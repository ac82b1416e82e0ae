"""Triton's log settings, applied to batchserve's logging while it runs.

Triton switches info, warning and error messages on and off one by one and has a verbose
level; Python logging has one threshold. ``LevelSwitches``, a filter on the server's log
handler, holds Triton's four switches, and the root logger's level follows the lowest
switch on, so a message switched off costs no formatting. ``log_format`` swaps the
handler's formatter (batchserve's ``json`` or ``text`` lines, or Triton's ``default`` or
``ISO8601`` ones); ``log_file`` is the one given at start ("" for the standard error
stream), never moved over the network, as Triton refuses to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from batchserve.core.errors import InvalidArgument, Unsupported
from batchserve.observability.logs import FORMATS, formatter

UINT32_MAX = 2**32 - 1
SWITCHES = ("log_info", "log_warning", "log_error")
KEYS = ("log_file", *SWITCHES, "log_verbose_level", "log_format")

Answer = dict[str, bool | int | str]


@dataclass
class LevelSwitches(logging.Filter):
    """Triton's switches; a record passes when its level's switch is on."""

    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "json"
    log_file: str = ""

    def __post_init__(self) -> None:
        super().__init__()

    @classmethod
    def from_level(cls, level: str, fmt: str, log_file: str = "") -> LevelSwitches:
        """The switches a ``--log-level`` stands for (debug is verbose level 1)."""
        threshold = logging.getLevelName(level.upper())
        if not isinstance(threshold, int):
            threshold = logging.INFO
        return cls(
            log_info=threshold <= logging.INFO,
            log_warning=threshold <= logging.WARNING,
            log_error=threshold <= logging.ERROR,
            log_verbose_level=1 if threshold <= logging.DEBUG else 0,
            log_format=fmt,
            log_file=log_file,
        )

    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level < logging.INFO:
            return self.log_verbose_level > 0
        if level < logging.WARNING:
            return self.log_info
        if level < logging.ERROR:
            return self.log_warning
        return self.log_error

    def threshold(self) -> int:
        """The lowest level any switch lets through: the root logger's level."""
        for on, level in (
            (self.log_verbose_level > 0, logging.DEBUG),
            (self.log_info, logging.INFO),
            (self.log_warning, logging.WARNING),
        ):
            if on:
                return level
        return logging.ERROR


def install(handler: logging.Handler, level: str, fmt: str, log_file: str = "") -> LevelSwitches:
    """Put the switches for ``level`` on the server's handler and set the root's level."""
    switches = LevelSwitches.from_level(level, fmt, log_file)
    handler.addFilter(switches)
    logging.getLogger().setLevel(switches.threshold())
    return switches


def _switches() -> tuple[LevelSwitches, list[logging.Handler]]:
    """The switches on the root logger's handlers (installed if logging was set up bare)."""
    root = logging.getLogger()
    for handler in root.handlers:
        for found in handler.filters:
            if isinstance(found, LevelSwitches):
                return found, [h for h in root.handlers if found in h.filters]
    switches = LevelSwitches.from_level(logging.getLevelName(root.getEffectiveLevel()), "text")
    for handler in root.handlers:
        handler.addFilter(switches)
    return switches, list(root.handlers)


def get() -> Answer:
    """Triton's answer: the file ("" for standard error), switches, verbose level, format."""
    switches, _ = _switches()
    answer: Answer = {"log_file": switches.log_file}
    answer.update({key: getattr(switches, key) for key in KEYS[1:]})
    return answer


_followers: list[Callable[[Answer], None]] = []


def follow(follower: Callable[[Answer], None]) -> None:
    """Call ``follower`` with the settings after every update: the workers of a server
    (``--workers``) log as the process that was asked does."""
    _followers.append(follower)


def update(updates: Mapping[str, object]) -> Answer:
    """Check every key first, then apply them all: a refused request changes nothing.
    A null value leaves that setting as it is (Triton's behaviour)."""
    parsed = {key: _parse(key, value) for key, value in updates.items()}
    switches, handlers = _switches()
    for key, value in parsed.items():
        if value is not None:
            setattr(switches, key, value)
    if "log_format" in parsed and parsed["log_format"] is not None:
        for handler in handlers:
            handler.setFormatter(formatter(switches.log_format))
    logging.getLogger().setLevel(switches.threshold())
    answer = get()
    for follower in _followers:
        follower(answer)
    return answer


def _parse(key: str, value: object) -> bool | int | str | None:
    if key not in KEYS:
        raise InvalidArgument(
            f"unknown log setting '{key[:64]}'; the settings are {', '.join(KEYS)}"
        )
    if value is None:
        return None
    if key == "log_file":
        raise Unsupported("log file location can not be updated through network protocol")
    if key in SWITCHES:
        if not isinstance(value, bool):
            raise InvalidArgument(f"expect boolean for '{key}'")
        return value
    if key == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= UINT32_MAX:
            raise InvalidArgument(f"expect an unsigned integer (uint32) for '{key}'")
        return value
    if not isinstance(value, str):
        raise InvalidArgument(f"expect string for '{key}'")
    if value not in FORMATS:
        raise InvalidArgument(
            f"invalid argument for log_format, got: {value[:32]}; batchserve writes "
            + " or ".join(repr(f) for f in FORMATS)
            + " lines"
        )
    return value
