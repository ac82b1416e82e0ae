"""Trace settings: Triton's keys and defaults, per-model values over global, and the
sampling they ask for (rate, count, a caller's trace context); ``--trace-config``, its
modes included."""

from __future__ import annotations

import pytest
from batchserve.core import trace_config
from batchserve.core.errors import InvalidArgument, Unsupported
from batchserve.core.trace_config import TraceConfig, parse_trace_config
from batchserve.observability.trace_settings import Sample, TraceSettings, json_updates

DEFAULT = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "trace_mode": "opentelemetry",
}
TRITON_MODE = TraceConfig(mode="triton", file="trace.json")


def test_the_defaults_are_triton_s() -> None:
    """As Triton answers them in each mode: the file and log frequency in ``triton`` only."""
    assert TraceSettings().get() == DEFAULT
    assert TraceSettings(TRITON_MODE).get() == {
        **DEFAULT, "log_frequency": "0", "trace_file": "trace.json", "trace_mode": "triton",
    }  # fmt: skip


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


def test_levels_switch_tracing_on_and_off() -> None:
    settings = TraceSettings()
    assert not settings.enabled
    assert settings.update({"trace_level": ["TIMESTAMPS"]})["trace_level"] == ["TIMESTAMPS"]
    assert settings.enabled
    answer = settings.update({"trace_level": ["TENSORS", "TIMESTAMPS"]})
    assert answer["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    assert settings.update({"trace_level": ["OFF"]})["trace_level"] == ["OFF"]
    assert not settings.enabled
    settings.update({"trace_level": ["TIMESTAMPS"]}, "m")  # one model's own level is enough
    assert settings.enabled
    settings.forget("m")
    assert not settings.enabled


def test_bad_levels_are_refused_with_triton_s_words() -> None:
    settings = TraceSettings()
    with pytest.raises(InvalidArgument, match="Expect only one trace level 'OFF'"):
        settings.update({"trace_level": ["OFF", "TENSORS"]})
    with pytest.raises(InvalidArgument, match="unknown trace level 'LOUD'"):
        settings.update({"trace_level": ["LOUD"]})
    with pytest.raises(InvalidArgument, match="'trace_level' needs a level"):
        settings.update({"trace_level": []})
    assert not settings.enabled


def _traced(settings: TraceSettings, requests: int, model: str = "m") -> int:
    return sum(settings.sample(model, propagated=False) is not None for _ in range(requests))


def test_rate_traces_every_nth_request_and_count_stops_after_n() -> None:
    settings = TraceSettings()
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["3"]})
    picks = [settings.sample("m", propagated=False) for _ in range(6)]
    traced = Sample("TIMESTAMPS", "", 0)
    assert picks == [None, None, traced, None, None, traced]
    settings.update({"trace_rate": ["1"], "trace_count": ["2"]})
    assert _traced(settings, 5) == 2
    assert settings.get()["trace_count"] == "0"  # the traces still to take, as Triton's
    settings.update({"trace_count": ["-1"]})
    assert _traced(settings, 5) == 5


def test_a_caller_s_trace_context_is_traced_whatever_rate_and_count_say() -> None:
    settings = TraceSettings()
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["0"], "trace_count": ["0"]})
    assert _traced(settings, 3) == 0
    assert settings.sample("m", propagated=True) == Sample("TIMESTAMPS", "", 0)
    settings.update({"trace_level": ["OFF"]})
    assert settings.sample("m", propagated=True) is None


def test_a_model_with_its_own_settings_samples_apart() -> None:
    settings = TraceSettings()
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"], "trace_count": ["1"]})
    settings.update({"trace_count": ["3"]}, "own")
    assert _traced(settings, 5, "own") == 3
    assert settings.get("own")["trace_count"] == "0"
    assert settings.get()["trace_count"] == "1"
    assert _traced(settings, 5, "other") == 1
    settings.update({"trace_level": ["OFF"]}, "own")
    assert _traced(settings, 2, "own") == 0


def test_a_worker_s_copy_follows_the_server_s_settings() -> None:
    server, worker = TraceSettings(), TraceSettings()
    server.follow(worker.restore)
    server.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"]})
    server.update({"trace_count": ["4"]}, "m")
    assert worker.enabled
    assert worker.get("m") == server.get("m")


def test_workers_take_a_count_together_through_the_server() -> None:
    """Each worker reports the traces it takes from a count; the server's count, the one a
    client reads, goes down with every report, and reaching 0 stops every worker."""
    server, first, second = TraceSettings(), TraceSettings(), TraceSettings()
    for worker in (first, second):
        server.follow(worker.restore)
        worker.on_taken(server.taken)
    server.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"], "trace_count": ["3"]})
    server.update({"trace_count": ["1"]}, "own")
    assert _traced(first, 2) == 2
    assert server.get()["trace_count"] == "1"
    assert _traced(second, 4) == 1  # the third: then the server's 0 reached both
    assert server.get()["trace_count"] == "0"
    assert first.get()["trace_count"] == second.get()["trace_count"] == "0"
    assert _traced(first, 2) == 0
    assert _traced(second, 3, "own") == 1  # a model's own count apart
    assert server.get("own")["trace_count"] == "0"
    assert server.get()["trace_count"] == "0"


def test_trace_config_sets_the_settings_a_server_starts_with() -> None:
    config = parse_trace_config(
        ["level=TIMESTAMPS", "level=TENSORS", "rate=1", "count=5", "mode=opentelemetry",
         "opentelemetry,url=collector:4318/v1/traces", "opentelemetry,resource=team=ml",
         "opentelemetry,bsp_schedule_delay=100"]
    )  # fmt: skip
    assert config == TraceConfig(
        "TIMESTAMPS,TENSORS", 1, 5, "http://collector:4318/v1/traces", {"team": "ml"},
        {"bsp_schedule_delay": 100}, "opentelemetry",
    )  # fmt: skip
    settings = TraceSettings(config)
    assert settings.enabled
    settings.update({"trace_rate": ["9"], "trace_count": ["1"]})
    settings.update({"trace_rate": None, "trace_count": None})  # cleared: back to the start
    assert settings.get()["trace_rate"] == "1"
    assert settings.get()["trace_count"] == "5"


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("level=LOUD", "the levels are OFF, TIMESTAMPS, TENSORS"),
        ("rate=often", "not a whole number"),
        ("count=-2", r"outside \[-1, 2147483647\]"),
        ("mode=json", "the modes are triton and opentelemetry"),
        ("jaeger,url=x", "the modes are triton and opentelemetry"),
        ("triton,port=1", "the triton settings are file and log-frequency"),
        ("triton,file=", "the file needs a path"),
        ("triton,log-frequency=-1", r"outside \[0, 4294967295\]"),
        ("level=TIMESTAMPS,mode=triton", "the levels are"),
        ("opentelemetry,port=4318", "the opentelemetry settings are url"),
        ("opentelemetry,resource=x", "expected resource=<key>=<value>"),
        ("level", "expected <setting>=<value>"),
    ],
)
def test_bad_trace_config_is_refused_naming_the_entry(entry: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_trace_config([entry])


@pytest.mark.parametrize(
    ("update", "words"),
    [
        ({"trace_rate": ["fast"]}, "Unable to parse 'trace_rate', got: fast"),
        ({"trace_rate": ["-1"]}, r"out of range \[ 0, 4294967295 \]"),
        (
            {"trace_count": ["-2"]},
            r"^Unable to parse 'trace_count'. Expecting value >= -1, got:-2$",
        ),
        ({"trace_count": ["3000000000"]}, r"out of range \[ -1, 2147483647 \], got: 3000000000$"),
        (
            {"trace_rate": ["99999999999999999999"]},
            r"^Unable to parse 'trace_rate', value is out of range \[ 0, 4294967295 \], got: 9+$",
        ),
        ({"log_frequency": ["1", "2"]}, "expect only 1 value for 'log_frequency'"),
        ({"trace_mode": ["triton"]}, "'trace_mode' can not be updated"),
        ({"sampling": ["1"]}, "unknown trace setting 'sampling'"),
        ({"log_frequency": ["often"]}, "Unable to parse 'log_frequency', got: often"),
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


def test_a_level_is_refused_where_the_sdk_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused when set, rather than failing every traced request."""
    monkeypatch.setattr(trace_config.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(Unsupported, match=r"pip install 'batchserve\[tracing\]'"):
        TraceSettings().update({"trace_level": ["TIMESTAMPS"]})
    with pytest.raises(ValueError, match="OpenTelemetry SDK"):
        parse_trace_config(["level=TIMESTAMPS"])
    assert TraceSettings().update({"trace_level": ["OFF"]})["trace_level"] == ["OFF"]


def test_the_mode_is_the_one_asked_for_else_the_one_its_settings_name() -> None:
    """Triton's ``triton`` mode where a trace file is given; ``opentelemetry`` otherwise,
    where Triton would default to a mode that, without a file, traces nothing."""
    assert parse_trace_config(["triton,file=t.json", "level=TIMESTAMPS"]).mode == "triton"
    assert parse_trace_config(["triton,log-frequency=2"]).log_frequency == 2
    assert parse_trace_config(["opentelemetry,url=x:4318"]).mode == "opentelemetry"
    assert parse_trace_config([]).mode == "opentelemetry"
    assert parse_trace_config(["mode=TRITON", "triton,file=t.json"]).mode == "triton"
    assert parse_trace_config(["mode=opentelemetry", "triton,file=t.json"]).mode == (
        "opentelemetry"
    )
    with pytest.raises(ValueError, match="trace file name is not given"):
        parse_trace_config(["mode=triton", "level=TIMESTAMPS"])


@pytest.mark.parametrize(
    ("word", "level"),
    [("MIN", "TIMESTAMPS"), ("max", "TIMESTAMPS"), ("on", "TIMESTAMPS"), ("true", "TIMESTAMPS"),
     ("false", "OFF"), ("Off", "OFF"), ("tensors", "TENSORS")],
)  # fmt: skip
def test_triton_s_older_level_words_are_read_as_it_reads_them(word: str, level: str) -> None:
    """``--trace-level=MIN`` is how Triton's own tests start tracing."""
    assert parse_trace_config(["triton,file=t.json", f"level={word}"]).level == level


def test_the_triton_mode_without_a_file_refuses_a_level_in_triton_s_words() -> None:
    settings = TraceSettings(TraceConfig(mode="triton"))
    with pytest.raises(
        InvalidArgument,
        match=r"^Attempting to set invalid trace setting :trace file name is not given$",
    ):
        settings.update({"trace_level": ["TIMESTAMPS"]})
    assert not settings.enabled


def test_the_triton_mode_needs_no_opentelemetry_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_config.importlib.util, "find_spec", lambda name: None)
    settings = TraceSettings(TRITON_MODE)
    assert settings.update({"trace_level": ["TENSORS"]})["trace_level"] == ["TENSORS"]
    assert parse_trace_config(["triton,file=t.json", "level=TIMESTAMPS"]).level == "TIMESTAMPS"


def test_a_sample_names_its_settings_and_their_log_frequency() -> None:
    """A model with settings of its own writes apart from the global ones (Triton's
    setting per model), each with its own log frequency."""
    settings = TraceSettings(TRITON_MODE)
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"], "log_frequency": ["5"]})
    settings.update({"log_frequency": ["2"]}, "own")
    assert settings.sample("m", propagated=False) == Sample("TIMESTAMPS", "", 5)
    assert settings.sample("own", propagated=False) == Sample("TIMESTAMPS", "own", 2)


def test_counted_traces_and_resets_are_reported() -> None:
    """What the trace files need: each trace taken from a count (the last, at rate 1, said
    so), and each scope set again."""
    counted: list[tuple[str, bool]] = []
    resets: list[str | None] = []
    settings = TraceSettings(TRITON_MODE)
    settings.on_counted(lambda scope, last: counted.append((scope, last)))
    settings.on_reset(resets.append)
    settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"], "trace_count": ["2"]})
    assert _traced(settings, 4) == 2
    assert counted == [("", False), ("", True)]
    settings.update({"trace_rate": ["2"]}, "own")
    settings.forget("own")
    assert resets == [None, "own", "own"]
    counted.clear()
    settings.update({"trace_rate": ["2"], "trace_count": ["1"]})
    assert _traced(settings, 2) == 1
    assert counted == [("", False)]  # the count ran out, but not every request was traced
    counted.clear()
    settings.update({"trace_rate": ["1"], "trace_count": ["1"]})
    settings.update({"log_frequency": ["3"]}, "own")  # written apart, counted globally
    assert _traced(settings, 2, "own") == 1
    assert counted == [("own", True)]
