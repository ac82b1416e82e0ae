"""Trace settings: Triton's keys and defaults, OFF only, per-model values over global."""

from __future__ import annotations

import pytest
from batchserve.core.errors import InvalidArgument, Unsupported
from batchserve.observability.trace_settings import TraceSettings, json_updates

DEFAULT = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_file": "",
    "trace_mode": "triton",
}


def test_the_defaults_are_triton_s() -> None:
    assert TraceSettings().get() == DEFAULT


def test_a_model_inherits_the_global_settings_until_it_has_its_own() -> None:
    settings = TraceSettings()
    settings.update({"trace_rate": ["5"]})
    assert settings.get("m")["trace_rate"] == "5"
    settings.update({"trace_rate": ["7"], "trace_count": ["3"]}, "m")
    assert settings.get("m")["trace_rate"] == "7"
    assert settings.get()["trace_rate"] == "5"
    settings.update({"trace_rate": None}, "m")  # cleared: back to the global value
    assert settings.get("m")["trace_rate"] == "5"
    settings.update({"trace_rate": None})  # cleared globally: back to the default
    assert settings.get()["trace_rate"] == "1000"
    settings.forget("m")
    assert settings.get("m")["trace_count"] == "-1"


def test_off_is_accepted_and_other_levels_are_refused() -> None:
    settings = TraceSettings()
    assert settings.update({"trace_level": ["OFF"]})["trace_level"] == ["OFF"]
    with pytest.raises(Unsupported, match="tracing is not available in batchserve yet"):
        settings.update({"trace_level": ["TIMESTAMPS"]})
    with pytest.raises(InvalidArgument, match="Expect only one trace level 'OFF'"):
        settings.update({"trace_level": ["OFF", "TENSORS"]})
    with pytest.raises(InvalidArgument, match="unknown trace level 'LOUD'"):
        settings.update({"trace_level": ["LOUD"]})


@pytest.mark.parametrize(
    ("update", "words"),
    [
        ({"trace_rate": ["fast"]}, "Unable to parse 'trace_rate', got: fast"),
        ({"trace_rate": ["-1"]}, r"out of range \[ 0, 4294967295 \]"),
        ({"trace_count": ["-2"]}, r"out of range \[ -1, 2147483647 \]"),
        ({"log_frequency": ["1", "2"]}, "expect only 1 value for 'log_frequency'"),
        ({"trace_mode": ["opentelemetry"]}, "'trace_mode' can not be updated"),
        ({"sampling": ["1"]}, "unknown trace setting 'sampling'"),
    ],
)
def test_bad_updates_are_refused_and_change_nothing(
    update: dict[str, list[str] | None], words: str
) -> None:
    settings = TraceSettings()
    with pytest.raises(InvalidArgument, match=words):
        settings.update({"trace_count": ["9"], **update})
    assert settings.get() == DEFAULT


def test_the_trace_file_cannot_be_moved_over_the_network() -> None:
    with pytest.raises(Unsupported, match="trace file location can not be updated"):
        TraceSettings().update({"trace_file": ["/tmp/x"]})


def test_json_values_become_lists_of_strings() -> None:
    assert json_updates({"trace_rate": "5", "trace_count": 3, "trace_level": ["OFF"]}) == {
        "trace_rate": ["5"],
        "trace_count": ["3"],
        "trace_level": ["OFF"],
    }
    assert json_updates({"trace_rate": None}) == {"trace_rate": None}
    with pytest.raises(InvalidArgument, match="'trace_rate' must be a string"):
        json_updates({"trace_rate": {"a": 1}})
