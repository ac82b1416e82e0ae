"""Structured logs: one JSON object per line, with the failed request's model and id."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest
from batchserve.observability.logs import RepeatLimit, bind_request, configure_logging


@pytest.fixture
def json_logs(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    """The root logger restored after a test that calls configure_logging (which must run in
    the test itself: its handler writes to the sys.stderr of the moment, capsys' there)."""
    root, server_logger = logging.getLogger(), logging.getLogger("uvicorn.error")
    handlers, level, filters = root.handlers[:], root.level, server_logger.filters[:]
    yield
    root.handlers[:], root.level = handlers, level
    server_logger.filters[:] = filters


def _lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines()]


def test_a_record_is_one_json_line_with_level_logger_and_extra_fields(
    json_logs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("info", "json")
    logging.getLogger("batchserve.test").warning("model ready", extra={"model": "m", "n": 2})
    logging.getLogger("uvicorn.error").info("Started", extra={"color_message": "\x1b[36mS"})
    first, second = _lines(capsys)
    assert first["level"] == "WARNING"
    assert first["logger"] == "batchserve.test"
    assert (first["message"], first["model"], first["n"]) == ("model ready", "m", 2)
    assert "time" in first
    assert "color_message" not in second


def test_a_bound_request_tags_the_records_of_its_own_task_only(
    json_logs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("info", "json")
    log = logging.getLogger("batchserve.test")

    async def failing_request() -> None:
        bind_request("digits", "req-7")
        log.error("unexpected error")
        log.error("explicit", extra={"model": "other"})

    async def main() -> None:
        await asyncio.create_task(failing_request())
        log.info("between requests")

    asyncio.run(main())
    tagged, explicit, outside = _lines(capsys)
    assert (tagged["model"], tagged["request_id"]) == ("digits", "req-7")
    assert (explicit["model"], explicit["request_id"]) == ("other", "req-7")
    assert "model" not in outside
    assert "request_id" not in outside


def test_a_repeated_warning_is_written_once_per_interval_and_counts_the_rest() -> None:
    now = [0.0]
    limit = RepeatLimit(interval=10.0, clock=lambda: now[0])
    log = logging.getLogger("uvicorn.error")

    def record(level: int, text: str) -> logging.LogRecord:
        return log.makeRecord(log.name, level, __file__, 1, text, (), None)

    passed = [limit.filter(record(logging.WARNING, "Invalid HTTP request received."))
              for _ in range(5)]  # fmt: skip
    assert passed == [True, False, False, False, False]
    assert limit.filter(record(logging.WARNING, "another text"))
    assert limit.filter(record(logging.ERROR, "Invalid HTTP request received."))
    assert limit.filter(record(logging.INFO, "Invalid HTTP request received."))
    now[0] = 10.5
    later = record(logging.WARNING, "Invalid HTTP request received.")
    assert limit.filter(later)
    assert later.repeats_not_logged == 4
    assert not limit.filter(record(logging.WARNING, "Invalid HTTP request received."))


def test_the_repeat_limit_remembers_a_bounded_number_of_texts() -> None:
    limit = RepeatLimit(interval=10.0, clock=lambda: 0.0)
    log = logging.getLogger("uvicorn.error")
    for n in range(RepeatLimit.MAX_TEXTS * 3):  # texts that vary: each passes, none piles up
        assert limit.filter(log.makeRecord(log.name, logging.WARNING, __file__, 1,
                                           f"from 10.0.0.{n}", (), None))  # fmt: skip
    assert len(limit._last) <= RepeatLimit.MAX_TEXTS


def test_the_http_servers_warnings_are_limited_once_however_often_logging_is_set_up(
    json_logs: None,
) -> None:
    configure_logging("info", "json")
    configure_logging("info", "text")
    server_logger = logging.getLogger("uvicorn.error")
    assert sum(isinstance(f, RepeatLimit) for f in server_logger.filters) == 1
