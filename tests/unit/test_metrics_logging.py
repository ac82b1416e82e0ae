"""Structured logs: one JSON object per line, with the failed request's model and id."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest
from batchserve.observability.logs import bind_request, configure_logging


@pytest.fixture
def json_logs(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    """The root logger restored after a test that calls configure_logging (which must run in
    the test itself: its handler writes to the sys.stderr of the moment, capsys' there)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


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
