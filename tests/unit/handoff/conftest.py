"""Fixtures shared by the hand-off tests."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from batchserve.observability import log_settings
from batchserve.observability.logs import configure_logging


@pytest.fixture
def own_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The server's logging set up as ``serve`` does, on a buffer, and put back after: the
    settings live on the root logger's handlers and the module's followers, which other
    tests rely on."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level, list(log_settings._followers)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    configure_logging("info", "json")
    yield
    root.handlers[:], level, log_settings._followers[:] = saved
    root.setLevel(level)
