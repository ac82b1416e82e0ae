"""Logging set-up: one JSON object per line by default, with model and request fields.

Every line carries ``time``, ``level``, ``logger`` and ``message``, plus the fields the
call passes in ``extra`` (``model``, ``version``, ...). A record logged while a failed
request is being answered also carries that request's ``model`` and ``request_id``
(``bind_request``), so an unexpected error in an adapter names the request it broke.

Access logs are off: a log line per request would cost more than the request itself
on the hot path.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

FORMATS = ("json", "text", "default", "ISO8601")  # the last two are Triton's line formats
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_TRITON_LEVELS = {logging.ERROR: "E", logging.WARNING: "W", logging.INFO: "I"}
# uvicorn adds a copy of its messages with terminal colour codes: noise in a JSON line.
# taskName: Python 3.12's record attribute (the asyncio task), which the JSON lines leave out too.
_NOT_FIELDS = (*RESERVED_ATTRS, "color_message", "taskName")

_request: ContextVar[tuple[str, str] | None] = ContextVar("batchserve_request", default=None)


def bind_request(model: str, request_id: str) -> None:
    """Tag the records logged from here on, in this task, with the request's model and id."""
    _request.set((model, request_id))


class RequestFields(logging.Filter):
    """Adds the bound request's ``model`` and ``request_id`` where the call gave none."""

    def filter(self, record: logging.LogRecord) -> bool:
        bound = _request.get()
        if bound is not None:
            model, request_id = bound
            if not hasattr(record, "model"):
                record.model = model
            if request_id and not hasattr(record, "request_id"):
                record.request_id = request_id
        return True


class RepeatLimit(logging.Filter):
    """Lets one record of each warning text through per ``interval`` seconds and counts the
    rest, which the next one through reports (``repeats_not_logged``). On the HTTP server's
    logger: uvicorn writes a warning line for every malformed request, so Triton's HTTP fuzz
    test (80,420 malformed request lines) wrote 76,960 identical lines; one client can fill
    a disk that way. Other levels always pass; at most ``MAX_TEXTS`` texts are remembered."""

    MAX_TEXTS = 256

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        text, now = record.getMessage(), self._clock()
        if len(self._last) >= self.MAX_TEXTS and text not in self._last:
            self._last.clear()  # texts that vary (an address in each) must not grow this
            self._held.clear()
        last = self._last.get(text)
        if last is not None and now - last < self._interval:
            self._held[text] = self._held.get(text, 0) + 1
            return False
        self._last[text] = now
        held = self._held.pop(text, 0)
        if held:
            record.repeats_not_logged = held
        return True


def with_fields(record: logging.LogRecord) -> str:
    """The record's message, then the fields its call passed in ``extra`` (``model``,
    ``reason``, ...), on one line: ``message (model=m, reason=...)``. The line formats wrote
    the message alone, so a model's load failure said "model failed to load" and not which
    model or why. A value's line breaks (a load's problems, one a line) become "; ", so that
    each record stays one line for tools that read a line as a record (and grep Triton's)."""
    fields = [
        f"{key}={str(value).replace(chr(10), '; ')}"
        for key, value in record.__dict__.items()
        if key not in _NOT_FIELDS and not key.startswith("_")
    ]
    message = record.getMessage()
    return f"{message} ({', '.join(fields)})" if fields else message


class TextFormatter(logging.Formatter):
    """``text``: ``time LEVEL logger: message (fields)``."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = with_fields(record)
        return super().formatMessage(record)


class TritonFormatter(logging.Formatter):
    """Triton's line preamble (its common/src/logging.cc), for log tooling written for it:
    ``default`` is ``I1125 01:02:03.456789 <pid> <file>:<line>] message`` and ``ISO8601`` is
    ``2026-11-25T01:02:03Z I <pid> <file>:<line>] message``, both in UTC."""

    def __init__(self, iso8601: bool) -> None:
        super().__init__()
        self.iso8601 = iso8601

    def format(self, record: logging.LogRecord) -> str:
        level = _TRITON_LEVELS.get(min(record.levelno, logging.ERROR) // 10 * 10, "V")
        when = time.gmtime(record.created)
        where = f"{os.getpid()} {record.filename}:{record.lineno}] {with_fields(record)}"
        if self.iso8601:
            return f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', when)} {level} {where}"
        micros = int(record.created % 1 * 1_000_000)
        return f"{level}{time.strftime('%m%d %H:%M:%S', when)}.{micros:06d} {where}"


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of one of ``FORMATS``; the log settings API swaps it while running."""
    if fmt in ("default", "ISO8601"):
        return TritonFormatter(iso8601=fmt == "ISO8601")
    if fmt == "json":
        return JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            reserved_attrs=_NOT_FIELDS,
        )
    return TextFormatter()


def release_log_file() -> None:
    """Close the log file (``--log-file``); it opens again, appending, at the next record.
    For a process about to close descriptors it did not open (the fork server): a file
    object kept over that would later write to, or close, whatever descriptor took its
    number, such as a worker's link to the model-owning process."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.close()


def configure_logging(
    level: str = "info",
    fmt: str = "json",
    switches: Mapping[str, bool | int] | None = None,
    log_file: Path | None = None,
) -> None:
    """Route every logger (uvicorn's and grpc's included) through one handler, to stderr or
    appended to ``log_file`` (Triton's ``--log-file``; appends from several processes stay
    whole lines); ``switches``: Triton's log switches given at start, over ``level``.
    Raises OSError when the file cannot be opened."""
    from batchserve.observability.log_settings import install, update  # builds on this module

    handler: logging.Handler = (
        logging.FileHandler(log_file, mode="a", encoding="utf-8")
        if log_file is not None
        else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(formatter(fmt))
    handler.addFilter(RequestFields())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    install(handler, level, fmt, str(log_file or ""))
    if switches:
        update(switches)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    http_server = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, RepeatLimit) for f in http_server.filters):
        http_server.addFilter(RepeatLimit())
    logging.getLogger("uvicorn.access").disabled = True
