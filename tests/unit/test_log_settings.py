"""Log settings change what the server's handler writes, as Triton's switches do."""

from __future__ import annotations

import calendar
import io
import json
import logging
import re
from collections.abc import Iterator

import pytest
from batchserve.core.errors import InvalidArgument, Unsupported
from batchserve.observability import log_settings
from batchserve.observability.logs import configure_logging, formatter


@pytest.fixture
def stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """The server's logging set up as ``serve`` does, writing to a buffer."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    buffer = io.StringIO()
    monkeypatch.setattr("sys.stderr", buffer)
    configure_logging("info", "json")
    yield buffer
    root.handlers[:], level = saved
    root.setLevel(level)


def _emit(stream: io.StringIO) -> list[str]:
    log = logging.getLogger("batchserve.test")
    stream.truncate(0)
    stream.seek(0)
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    return [json.loads(line)["message"] for line in stream.getvalue().splitlines()]


def test_tritons_switches_given_at_start_override_the_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``serve --log-level warning --log-verbose 1 --log-error false``, as ``serve`` sets up."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    buffer = io.StringIO()
    monkeypatch.setattr("sys.stderr", buffer)
    try:
        configure_logging("warning", "json", {"log_verbose_level": 1, "log_error": False})
        answer = log_settings.get()
        written = _emit(buffer)
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    assert (answer["log_info"], answer["log_warning"], answer["log_error"]) == (
        False,
        True,
        False,
    )
    assert answer["log_verbose_level"] == 1
    assert written == ["d", "w"]


def test_the_log_level_sets_triton_s_switches(stream: io.StringIO) -> None:
    assert log_settings.get() == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "json",
    }
    assert _emit(stream) == ["i", "w", "e"]


def test_each_switch_changes_what_is_written(stream: io.StringIO) -> None:
    log_settings.update({"log_verbose_level": 1})
    assert _emit(stream) == ["d", "i", "w", "e"]
    log_settings.update({"log_verbose_level": 0, "log_info": False})
    assert _emit(stream) == ["w", "e"]
    log_settings.update({"log_warning": False})
    assert _emit(stream) == ["e"]
    log_settings.update({"log_error": False, "log_info": True})
    assert _emit(stream) == ["i"]
    assert logging.getLogger().level == logging.INFO  # switched-off debug costs nothing


def test_null_leaves_a_setting_as_it_is(stream: io.StringIO) -> None:
    log_settings.update({"log_info": False})
    assert log_settings.update({"log_info": None, "log_file": None})["log_info"] is False


def test_the_format_is_swapped_while_running(stream: io.StringIO) -> None:
    assert log_settings.update({"log_format": "text"})["log_format"] == "text"
    logging.getLogger("batchserve.test").warning("plain")
    assert stream.getvalue().rstrip().endswith("WARNING batchserve.test: plain")


@pytest.mark.parametrize(
    ("update", "error", "words"),
    [
        ({"log_info": "yes"}, InvalidArgument, "expect boolean for 'log_info'"),
        ({"log_verbose_level": -1}, InvalidArgument, "uint32"),
        ({"log_verbose_level": True}, InvalidArgument, "uint32"),
        ({"log_format": "iso8601"}, InvalidArgument, "invalid argument for log_format"),
        ({"log_format": 1}, InvalidArgument, "expect string for 'log_format'"),
        ({"log_colour": True}, InvalidArgument, "unknown log setting 'log_colour'"),
        ({"log_file": "x.log"}, Unsupported, "log file location can not be updated"),
    ],
)
def test_bad_updates_are_refused_and_change_nothing(
    stream: io.StringIO, update: dict[str, object], error: type[Exception], words: str
) -> None:
    before = log_settings.get()
    with pytest.raises(error, match=words):
        log_settings.update({"log_info": False, **update})
    assert log_settings.get() == before


@pytest.mark.parametrize(
    ("fmt", "line"),
    [
        ("default", r"^W1125 01:02:03\.250000 \d+ test_log_settings\.py:\d+\] disk is full$"),
        ("ISO8601", r"^2026-11-25T01:02:03Z W \d+ test_log_settings\.py:\d+\] disk is full$"),
    ],
)
def test_tritons_line_formats_are_written_as_triton_writes_them(fmt: str, line: str) -> None:
    record = logging.getLogger("x").makeRecord(
        "x", logging.WARNING, __file__, 7, "disk is %s", ("full",), None
    )
    record.created = calendar.timegm((2026, 11, 25, 1, 2, 3)) + 0.25
    assert re.match(line, formatter(fmt).format(record))


@pytest.mark.parametrize(
    ("fmt", "line"),
    [
        ("text", r"^\S+ \S+ ERROR x: model failed to load \(model=m, reason=a\.onnx: no file; "
                 r"b\.pbtxt: bad\)$"),
        ("default", r"^E\d{4} [\d:.]+ \d+ test_log_settings\.py:\d+\] model failed to load "
                    r"\(model=m, reason=a\.onnx: no file; b\.pbtxt: bad\)$"),
    ],
)  # fmt: skip
def test_line_formats_carry_the_fields_of_the_call_on_one_line(fmt: str, line: str) -> None:
    """A model's failed load in a line format said "model failed to load" alone: which model
    and why were in ``extra``, which only the JSON lines wrote."""
    record = logging.getLogger("x").makeRecord(
        "x", logging.ERROR, __file__, 7, "model failed to load", (), None,
        extra={"model": "m", "reason": "a.onnx: no file\nb.pbtxt: bad"},
    )  # fmt: skip
    assert re.match(line, formatter(fmt).format(record))
