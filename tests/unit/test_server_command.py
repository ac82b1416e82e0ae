import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from batchserve.cli import build_parser
from batchserve.core.budgets import DEFAULT_BUDGET, BudgetSpec
from batchserve.core.settings import ClientShm, ModelControlMode, Settings
from batchserve.core.tls import TlsMode
from batchserve.grpc.options import server_options
from batchserve.runtime.serve_command import (
    FLAGS,
    METRICS_SWITCHES,
    REPEATED,
    SWITCHES,
    run,
    settings_errors,
    settings_from_args,
)
from pydantic import ValidationError

from tests.tls_certs import make_pki

GIB = 1 << 30


def _settings(*argv: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def _clear_environment(monkeypatch: pytest.MonkeyPatch, prefix: str = "BATCHSERVE_") -> None:
    """No variable starting with ``prefix`` for this test, whatever the shell set."""
    for key in list(os.environ):
        if key.startswith(prefix):
            monkeypatch.delenv(key)


def test_defaults_follow_triton_and_listen_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_environment(monkeypatch)
    settings = _settings()
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (8000, 8001, 8002)
    assert settings.host == "127.0.0.1"
    assert settings.model_control_mode is ModelControlMode.NONE
    assert settings.model_repository == (Path("model_repo"),)
    assert settings.allow_client_shm is ClientShm.LOCAL  # only clients on this host


def test_client_shared_memory_is_turned_on_and_off_as_in_triton() -> None:
    assert _settings("--allow-client-shm=true").allow_client_shm is ClientShm.TRUE
    assert _settings("--allow-client-shm", "false").allow_client_shm is ClientShm.FALSE
    assert _settings("--allow-client-shm", "local").allow_client_shm is ClientShm.LOCAL
    with pytest.raises(ValidationError, match="allow_client_shm"):
        _settings("--allow-client-shm", "maybe")


def test_flags_override_environment_which_overrides_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATCHSERVE_HTTP_PORT", "9000")
    monkeypatch.setenv("BATCHSERVE_GRPC_PORT", "9001")
    monkeypatch.setenv("BATCHSERVE_MODEL_CONTROL_MODE", "explicit")
    settings = _settings("--grpc-port", "7001", "--load-model", "a", "--load-model", "b")
    assert settings.http_port == 9000
    assert settings.grpc_port == 7001
    assert settings.model_control_mode is ModelControlMode.EXPLICIT
    assert settings.load_model == ("a", "b")


def test_invalid_values_are_refused() -> None:
    with pytest.raises(ValidationError, match="model_control_mode"):
        _settings("--model-control-mode", "sometimes")
    with pytest.raises(ValidationError, match="http_port"):
        _settings("--http-port", "70000")
    with pytest.raises(ValidationError, match="busy_poll_us"):
        _settings("--busy-poll-us", "-1")


def test_busy_polling_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BATCHSERVE_BUSY_POLL_US", raising=False)
    assert _settings().busy_poll_us == 0
    assert _settings("--busy-poll-us", "300").busy_poll_us == 300


def test_body_limits_default_to_16_and_64_mib_and_are_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BATCHSERVE_MAX_JSON_BODY_BYTES", raising=False)
    monkeypatch.delenv("BATCHSERVE_MAX_BINARY_BODY_BYTES", raising=False)
    defaults = _settings()
    assert (defaults.max_json_body_bytes, defaults.max_binary_body_bytes) == (16 << 20, 64 << 20)
    given = _settings("--max-json-body-bytes", "1000", "--max-binary-body-bytes", "2000")
    assert (given.max_json_body_bytes, given.max_binary_body_bytes) == (1000, 2000)


def test_tritons_http_max_input_size_sets_each_body_limit_not_given_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Triton has one limit where batchserve has two: its flag sets both, and a limit given
    by its own flag or variable keeps its value."""
    for name in ("MAX_JSON_BODY_BYTES", "MAX_BINARY_BODY_BYTES", "HTTP_MAX_INPUT_SIZE"):
        monkeypatch.delenv(f"BATCHSERVE_{name}", raising=False)
    both = _settings("--http-max-input-size", "134217728")
    assert (both.max_json_body_bytes, both.max_binary_body_bytes) == (128 << 20, 128 << 20)
    json_apart = _settings("--http-max-input-size=1000", "--max-json-body-bytes", "500")
    assert (json_apart.max_json_body_bytes, json_apart.max_binary_body_bytes) == (500, 1000)
    monkeypatch.setenv("BATCHSERVE_MAX_BINARY_BODY_BYTES", "3000")
    binary_apart = _settings("--http-max-input-size", "1000")
    assert (binary_apart.max_json_body_bytes, binary_apart.max_binary_body_bytes) == (1000, 3000)
    monkeypatch.delenv("BATCHSERVE_MAX_BINARY_BODY_BYTES")
    monkeypatch.setenv("BATCHSERVE_HTTP_MAX_INPUT_SIZE", "2000")
    from_variable = _settings()
    assert (from_variable.max_json_body_bytes, from_variable.max_binary_body_bytes) == (2000, 2000)


@pytest.mark.parametrize("size", ["0", "-5"])
def test_an_http_max_input_size_that_is_no_size_is_refused_once_by_name(
    size: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BATCHSERVE_HTTP_MAX_INPUT_SIZE", raising=False)
    with pytest.raises(ValidationError) as refusal:
        _settings(f"--http-max-input-size={size}")
    assert [error["loc"] for error in refusal.value.errors()] == [("http_max_input_size",)]
    assert "Error: --http-max-input-size must be greater than 0." in str(refusal.value)


@pytest.mark.parametrize(("flag", "field"), [("--allow-http", "allow_http"),
                                             ("--allow-grpc", "allow_grpc")])  # fmt: skip
def test_tritons_protocol_switches_turn_a_protocol_off(flag: str, field: str) -> None:
    """Command lines written for Triton pass them (KServe's runtime: both true; Triton's
    L0_socket: 0 or false to serve one protocol alone)."""
    assert getattr(_settings(f"{flag}=true"), field) is True
    assert getattr(_settings(), field) is True
    assert getattr(_settings(f"{flag}=0"), field) is False
    assert getattr(_settings(flag, "false"), field) is False


def test_a_protocol_turned_off_takes_no_port_that_could_clash() -> None:
    """Triton's port check leaves out what it does not serve: L0_socket starts
    ``--http-port 8007 --grpc-port 8007 --allow-http 0``."""
    one_port = ("--http-port", "8007", "--grpc-port", "8007")
    assert _settings(*one_port, "--allow-http", "0").grpc_port == 8007
    assert _settings(*one_port, "--allow-grpc", "0").http_port == 8007
    with pytest.raises(ValidationError, match="cannot listen to HTTP requests and GRPC"):
        _settings(*one_port)
    with pytest.raises(ValidationError, match="cannot listen to GRPC requests and metrics"):
        _settings("--grpc-port", "8009", "--metrics-port", "8009", "--allow-http", "false")


def test_tritons_start_up_flags_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_environment(monkeypatch)
    defaults = _settings()
    assert (defaults.strict_readiness, defaults.exit_on_error) == (True, False)
    given = _settings("--strict-readiness=false", "--exit-on-error=true", "--exit-timeout-secs=7")
    assert (given.strict_readiness, given.exit_on_error) == (False, True)
    assert given.shutdown_timeout_seconds == 7


def test_tritons_program_name_is_taken_and_nothing_else(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _settings("tritonserver", "--model-store=/m").model_repository == (Path("/m"),)
    assert run(build_parser().parse_args(["serve", "batchserve"])) == 2
    assert "unrecognized arguments: batchserve (only 'tritonserver'" in capsys.readouterr().err


def test_a_flag_batchserve_does_not_know_is_named_not_its_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Its value used to land on the program word, and the error named 'tritonserver' as the
    only choice, hiding the flag."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--no-such-flag", "local,size=1"])
    error = capsys.readouterr().err
    assert "unrecognized arguments: --no-such-flag" in error
    assert "invalid choice" not in error


def test_every_flag_is_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    flags = [flag for flag, *_ in FLAGS] + [flag for flag, *_ in SWITCHES + REPEATED]
    missing = [flag for flag in flags if not re.search(f"`{re.escape(flag)}[` =]", readme)]
    assert missing == []


def test_every_default_a_flag_names_in_its_help_is_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clear_environment(monkeypatch)
    defaults = Settings()
    named = {}
    for flag, field, kind, text in FLAGS:
        if match := re.search(r"\(default ([^;)]+)", text):
            named[flag] = (kind(match[1]), getattr(defaults, field))
    assert {"--http-header-timeout", "--http-body-timeout", "--http-body-min-rate"} <= set(named)
    assert named["--http-header-timeout"][0] == 20
    assert named["--http-body-min-rate"][0] == 500
    for flag, (in_help, default) in named.items():
        assert in_help == default, flag


@pytest.mark.parametrize(
    "flag", ["--http-header-timeout", "--http-body-timeout", "--http-body-min-rate"]
)
def test_http_read_timeouts_cannot_be_turned_into_no_limit(flag: str) -> None:
    with pytest.raises(ValidationError):
        _settings(flag, "0")
    with pytest.raises(ValidationError):
        _settings(flag, "-1")


def test_grpc_connection_limits_are_flags_in_milliseconds_as_in_triton() -> None:
    settings = _settings(
        "--grpc-handshake-timeout", "1500", "--grpc-max-connection-idle", "60000",
        "--grpc-keepalive-time", "30000", "--grpc-keepalive-timeout", "5000",
        "--grpc-max-concurrent-calls", "100",
    )  # fmt: skip
    assert settings.grpc_handshake_timeout_ms == 1500
    assert settings.grpc_max_connection_idle_ms == 60000
    assert settings.grpc_keepalive_time_ms == 30000
    assert settings.grpc_keepalive_timeout_ms == 5000
    assert settings.grpc_max_concurrent_calls == 100
    with pytest.raises(ValidationError, match="grpc_keepalive_time_ms"):
        _settings("--grpc-keepalive-time", "0")
    with pytest.raises(ValidationError, match="grpc_max_connection_idle_ms"):
        _settings("--grpc-max-connection-idle", str(2**31))


# Triton's flag, the channel argument it sets in grpc core, a value and what core is given.
TRITON_KEEPALIVE_FLAGS = [
    ("--grpc-keepalive-permit-without-calls", "grpc.keepalive_permit_without_calls", "1", 1),
    ("--grpc-http2-max-pings-without-data", "grpc.http2.max_pings_without_data", "0", 0),
    (
        "--grpc-http2-min-recv-ping-interval-without-data",
        "grpc.http2.min_ping_interval_without_data_ms",
        "10000",
        10_000,
    ),
    ("--grpc-http2-max-ping-strikes", "grpc.http2.max_ping_strikes", "5", 5),
    ("--grpc-max-connection-age", "grpc.max_connection_age_ms", "600000", 600_000),
]


@pytest.mark.parametrize(("flag", "argument", "value", "given"), TRITON_KEEPALIVE_FLAGS)
def test_each_triton_keepalive_flag_reaches_its_grpc_channel_argument(
    flag: str, argument: str, value: str, given: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_environment(monkeypatch)
    default = dict(server_options(_settings())).get(argument)
    assert default != given, "the value must differ from the default to prove anything"
    assert dict(server_options(_settings(flag, value)))[argument] == given


@pytest.mark.parametrize(("flag", "argument", "value", "given"), TRITON_KEEPALIVE_FLAGS)
def test_each_triton_keepalive_flag_is_also_a_batchserve_variable(
    flag: str, argument: str, value: str, given: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    field = next(field for name, field, _, _ in FLAGS if name == flag)
    monkeypatch.setenv(f"BATCHSERVE_{field.upper()}", value)
    assert dict(server_options(_settings()))[argument] == given


def test_keepalive_defaults_are_grpc_cores_and_tritons(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's help text names these defaults; grpc core's are the same, so a server that
    passes them behaves as one that passes nothing. No connection age: Triton's "undefined"."""
    _clear_environment(monkeypatch)
    options = dict(server_options(_settings()))
    assert options["grpc.keepalive_permit_without_calls"] == 0
    assert options["grpc.http2.max_pings_without_data"] == 2
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == 300_000
    assert options["grpc.http2.max_ping_strikes"] == 2
    assert "grpc.max_connection_age_ms" not in options
    assert "grpc.max_connection_age_grace_ms" not in options


def test_connection_age_and_its_grace_are_milliseconds_and_the_grace_needs_an_age() -> None:
    options = dict(
        server_options(
            _settings("--grpc-max-connection-age", "300000", "--grpc-max-connection-age-grace", "0")
        )
    )
    assert options["grpc.max_connection_age_ms"] == 300_000
    assert options["grpc.max_connection_age_grace_ms"] == 0  # close at once
    with pytest.raises(ValidationError, match="--grpc-max-connection-age-grace needs --grpc-max"):
        _settings("--grpc-max-connection-age-grace", "30000")


def test_connection_age_and_grace_are_batchserve_variables_as_the_manifests_set_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATCHSERVE_GRPC_MAX_CONNECTION_AGE_MS", "240000")
    monkeypatch.setenv("BATCHSERVE_GRPC_MAX_CONNECTION_AGE_GRACE_MS", "30000")
    options = dict(server_options(_settings()))
    assert options["grpc.max_connection_age_ms"] == 240_000
    assert options["grpc.max_connection_age_grace_ms"] == 30_000


@pytest.mark.parametrize(
    ("word", "permitted"),
    [("true", True), ("1", True), ("ON", True), ("false", False), ("0", False), ("off", False)],
)
def test_permit_without_calls_takes_tritons_boolean_words(word: str, permitted: bool) -> None:
    settings = _settings("--grpc-keepalive-permit-without-calls", word)
    assert settings.grpc_keepalive_permit_without_calls is permitted


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--grpc-keepalive-permit-without-calls", "maybe"],
            "--grpc-keepalive-permit-without-calls must be true or false (1 or 0), not 'maybe'",
        ),
        (
            ["--grpc-http2-max-ping-strikes", "-1"],
            "grpc_http2_max_ping_strikes: Input should be greater than or equal to 0",
        ),
        (
            ["--grpc-http2-max-pings-without-data", "-1"],
            "grpc_http2_max_pings_without_data: Input should be greater than or equal to 0",
        ),
        (
            ["--grpc-http2-min-recv-ping-interval-without-data", str(2**31)],
            "grpc_http2_min_recv_ping_interval_without_data_ms: Input should be less than or "
            "equal to 2147483647",
        ),
        (
            ["--grpc-max-connection-age", "0"],
            "grpc_max_connection_age_ms: Input should be greater than 0",
        ),
        (
            ["--grpc-max-connection-age", "1000", "--grpc-max-connection-age-grace", "-1"],
            "grpc_max_connection_age_grace_ms: Input should be greater than or equal to 0",
        ),
    ],
)
def test_out_of_range_keepalive_values_are_refused_naming_the_setting(
    argv: list[str], message: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        _settings(*argv)
    [line] = settings_errors(refused.value)
    assert message in line


def test_the_log_level_is_one_of_four_in_any_case() -> None:
    assert _settings("--log-level", "WARNING").log_level == "warning"
    assert _settings("--log-level", "debug").log_level == "debug"
    with pytest.raises(ValidationError, match="--log-level must be debug, info, warning or error"):
        _settings("--log-level", "verbose")


def test_serve_refuses_an_unknown_log_level_in_one_line_before_starting(tmp_path: Path) -> None:
    """Run as the operator does. A server that got past its settings would fail on the
    missing repository instead (exit 1, a traceback), so it never serves here."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSERVE_")}
    command = [sys.executable, "-m", "batchserve.cli", "serve", "--log-level", "nonsense",
               "--model-repository", str(tmp_path / "missing"), "--http-port", "0",
               "--grpc-port", "0", "--metrics-port", "0"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "batchserve serve: log_level: --log-level must be debug, info, warning or error, "
        "not 'nonsense'"
    ]


NOT_A_BUDGET = (
    "memory budget 'lots' is neither a fraction (0.8, 80%) nor a size (512MiB, 8GiB, 2147483648)"
)


def _refused(flag: str, value: str) -> list[str]:
    """The settings' errors for ``flag value``."""
    with pytest.raises(ValidationError) as refused:
        _settings(flag, value)
    return settings_errors(refused.value)


def test_the_memory_budget_is_parsed_once_into_a_budget_per_device_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BATCHSERVE_MEMORY_BUDGET", raising=False)
    assert _settings().memory_budget == {"cpu": DEFAULT_BUDGET, "gpu": DEFAULT_BUDGET}
    assert _settings("--memory-budget", "cpu=2GiB").memory_budget == {
        "cpu": BudgetSpec(nbytes=2 * GIB),
        "gpu": DEFAULT_BUDGET,
    }
    monkeypatch.setenv("BATCHSERVE_MEMORY_BUDGET", "gpu=50%")  # the flag's syntax, not JSON
    assert _settings().memory_budget == {"cpu": DEFAULT_BUDGET, "gpu": BudgetSpec(0.5)}
    assert _refused("--memory-budget", "lots") == [f"memory_budget: {NOT_A_BUDGET}"]


def test_the_memory_for_requests_is_a_share_of_the_memory_or_a_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BATCHSERVE_MAX_REQUEST_MEMORY", raising=False)
    assert _settings().max_request_memory == BudgetSpec(0.25)
    assert _settings("--max-request-memory", "4GiB").max_request_memory == BudgetSpec(
        nbytes=4 * GIB
    )
    monkeypatch.setenv("BATCHSERVE_MAX_REQUEST_MEMORY", "10%")
    assert _settings().max_request_memory == BudgetSpec(0.1)
    assert _refused("--max-request-memory", "lots") == [f"max_request_memory: {NOT_A_BUDGET}"]


def test_an_untaken_answer_is_dropped_after_the_send_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BATCHSERVE_HTTP_SEND_TIMEOUT", raising=False)
    assert _settings().http_send_timeout_seconds == 60.0
    assert _settings("--http-send-timeout", "2.5").http_send_timeout_seconds == 2.5
    for bad in ("0", "-1", "3601"):
        with pytest.raises(ValidationError, match="http_send_timeout_seconds"):
            _settings("--http-send-timeout", bad)


def test_workers_are_auto_or_a_count_and_cpus_a_positive_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clear_environment(monkeypatch)
    assert (_settings().workers, _settings().cpus) == ("auto", None)
    assert _settings("--workers", "4", "--cpus", "16").workers == "4"
    monkeypatch.setenv("BATCHSERVE_WORKERS", "2")
    monkeypatch.setenv("BATCHSERVE_CPUS", "3")
    assert (_settings().workers, _settings().cpus) == ("2", 3)
    for bad in ("0", "-1", "two", "1.5", "1000"):
        with pytest.raises(ValidationError, match="workers"):
            _settings("--workers", bad)
    with pytest.raises(ValidationError, match="cpus"):
        _settings("--cpus", "0")


def test_cpu_scheduling_is_batch_unless_asked_for_normal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BATCHSERVE_CPU_SCHEDULING", raising=False)
    assert _settings().cpu_scheduling == "batch"
    assert _settings("--cpu-scheduling", "normal").cpu_scheduling == "normal"
    monkeypatch.setenv("BATCHSERVE_CPU_SCHEDULING", "normal")
    assert _settings().cpu_scheduling == "normal"
    with pytest.raises(ValidationError) as refused:
        _settings("--cpu-scheduling", "realtime")
    assert settings_errors(refused.value) == ["cpu_scheduling: Input should be 'batch' or 'normal'"]


def test_model_analyzers_command_line_starts_the_server_as_tritonserver_would() -> None:
    """The flags NVIDIA's Model Analyzer 1.58 gives the server it launches (local mode)."""
    settings = _settings(
        "--model-repository", "/models", "--model-control-mode", "explicit",
        "--http-port", "8000", "--grpc-port", "8001", "--metrics-port", "8002",
        "--metrics-interval-ms", "1000", "--strict-model-config", "false",
    )  # fmt: skip
    assert settings.model_control_mode is ModelControlMode.EXPLICIT
    assert settings.metrics_interval_ms == 1000
    assert settings.disable_auto_complete_config is False


@pytest.mark.parametrize(
    ("argv", "disabled"),
    [
        ([], False),
        (["--disable-auto-complete-config"], True),
        (["--strict-model-config", "true"], True),
        (["--strict-model-config=ON"], True),
        (["--strict-model-config", "0"], False),
        (["--strict-model-config", "false", "--disable-auto-complete-config"], True),
        # Triton's rule, whichever comes last: the newer flag wins (the last flag used to)
        (["--disable-auto-complete-config", "--strict-model-config=false"], True),
    ],
)
def test_auto_completion_is_turned_off_by_either_of_tritons_flags(
    argv: list[str], disabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BATCHSERVE_DISABLE_AUTO_COMPLETE_CONFIG", raising=False)
    assert _settings(*argv).disable_auto_complete_config is disabled


def test_auto_completion_is_also_a_variable_and_the_flag_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATCHSERVE_DISABLE_AUTO_COMPLETE_CONFIG", "true")
    assert _settings().disable_auto_complete_config is True
    assert _settings("--strict-model-config", "false").disable_auto_complete_config is False


def test_the_older_flag_is_warned_of_in_tritons_words(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from batchserve.observability import logs
    from batchserve.runtime import app

    monkeypatch.setattr(app, "run", lambda settings: 0)  # the warnings come before the start
    monkeypatch.setattr(logs, "configure_logging", lambda *args: None)
    argv = ["serve", "--disable-auto-complete-config", "--strict-model-config", "false"]
    assert run(build_parser().parse_args(argv)) == 0
    assert capsys.readouterr().err.splitlines() == [
        "Warning: '--strict-model-config' has been deprecated! Please use "
        "'--disable-auto-complete-config' instead.",
        "Warning: Overriding deprecated '--strict-model-config' from False to True in favor "
        "of '--disable-auto-complete-config'!",
    ]


def test_a_strict_model_config_that_is_not_a_boolean_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--strict-model-config", "maybe"])
    assert "must be true or false (1 or 0), not 'maybe'" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-5", str(2**31)])
def test_the_metrics_interval_is_a_positive_number_of_milliseconds(value: str) -> None:
    with pytest.raises(ValidationError, match="metrics_interval_ms"):
        _settings("--metrics-interval-ms", value)


@pytest.mark.parametrize("field", [field for _, field, _ in METRICS_SWITCHES])
def test_tritons_metrics_switches_are_on_unless_turned_off(
    field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(f"BATCHSERVE_{field.upper()}", raising=False)
    flag = "--" + field.replace("_", "-")
    assert getattr(_settings(), field) is True
    assert getattr(_settings(f"{flag}=false"), field) is False
    assert getattr(_settings(flag, "0"), field) is False
    assert getattr(_settings(flag, "ON"), field) is True
    monkeypatch.setenv(f"BATCHSERVE_{field.upper()}", "false")
    assert getattr(_settings(), field) is False
    assert getattr(_settings(flag, "true"), field) is True  # the flag wins


def test_tritons_log_flags_become_the_switches_of_its_logging_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clear_environment(monkeypatch, "BATCHSERVE_LOG_")
    assert _settings().log_switches() == {}  # --log-level alone decides
    given = _settings("--log-verbose=1", "--log-info", "false", "--log-error=ON")
    assert given.log_switches() == {"log_verbose_level": 1, "log_info": False, "log_error": True}
    assert _settings("--log-verbose", "0").log_switches() == {"log_verbose_level": 0}
    monkeypatch.setenv("BATCHSERVE_LOG_WARNING", "false")
    assert _settings().log_switches() == {"log_warning": False}
    with pytest.raises(ValidationError, match="log_verbose"):
        _settings("--log-verbose", "-1")


def test_the_model_store_is_tritons_older_name_for_the_repository() -> None:
    assert _settings("--model-store", "/srv/models").model_repository == (Path("/srv/models"),)


def test_every_repository_given_is_served_in_order_each_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Triton takes --model-repository again and serves the union; the flag replaces the
    variable's one repository rather than adding to it."""
    given = _settings("--model-store=/a", "--model-repository=/b", "--model-repository", "/a")
    assert given.model_repository == (Path("/a"), Path("/b"))
    monkeypatch.setenv("BATCHSERVE_MODEL_REPOSITORY", "/from/env")
    assert _settings().model_repository == (Path("/from/env"),)
    assert _settings("--model-repository=/c").model_repository == (Path("/c"),)


def test_each_listener_takes_tritons_address_flag_else_the_host() -> None:
    plain = _settings("--host", "0.0.0.0")
    assert (plain.http_host(), plain.grpc_host(), plain.metrics_host()) == ("0.0.0.0",) * 3
    apart = _settings("--http-address", "10.0.0.5", "--grpc-address=10.0.0.6")
    # the metrics port follows the HTTP address unless given its own, as in Triton
    assert (apart.http_host(), apart.grpc_host(), apart.metrics_host()) == (
        "10.0.0.5",
        "10.0.0.6",
        "10.0.0.5",
    )
    assert _settings("--metrics-address", "127.0.0.3").metrics_host() == "127.0.0.3"


def test_tritons_older_trace_flags_are_read_as_their_trace_config_settings() -> None:
    given = _settings("--trace-level", "TIMESTAMPS", "--trace-rate=5", "--trace-config", "count=3")
    assert given.trace_config == ("level=TIMESTAMPS", "rate=5", "count=3")
    traced = _settings("--trace-file=trace.json", "--trace-level=MIN", "--trace-log-frequency=2")
    assert traced.trace_config == ("triton,file=trace.json", "level=MIN", "triton,log-frequency=2")
    with pytest.raises(ValidationError, match="trace file name is not given"):
        _settings("--trace-level=TIMESTAMPS", "--trace-config", "mode=triton")


def test_tritons_thread_counts_and_header_patterns_are_checked_as_triton_checks_them() -> None:
    """Flags a Triton command line passes (its L0_grpc, L0_sequence_stress): they used to
    stop the start as unrecognized arguments."""
    taken = _settings(
        "--grpc-infer-thread-count", "128", "--http-thread-count", "4",
        "--http-header-forward-pattern", "x-.*", "--grpc-header-forward-pattern=.*",
        "--grpc-infer-response-compression-level", "HIGH",
    )  # fmt: skip
    assert (taken.grpc_infer_thread_count, taken.http_thread_count) == (128, 4)
    assert taken.grpc_infer_response_compression_level == "high"
    for count in ("1", "129"):
        with pytest.raises(ValidationError, match="Must be in the range 2 to 128"):
            _settings("--grpc-infer-thread-count", count)
    with pytest.raises(ValidationError, match="not a regular expression"):
        _settings("--http-header-forward-pattern", "x-(")
    with pytest.raises(ValidationError, match="grpc_infer_response_compression_level"):
        _settings("--grpc-infer-response-compression-level", "max")


def test_l0_infers_command_line_starts(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Triton's L0_infer and L0_perf_nomodel pass these; each stopped the start as an
    unrecognized argument. The flags that change nothing here are named in the log."""
    from batchserve.observability import logs
    from batchserve.runtime import app

    started: list[Settings] = []
    monkeypatch.setattr(app, "run", lambda settings: started.append(settings) or 0)
    monkeypatch.setattr(logs, "configure_logging", lambda *args: None)
    argv = [
        "serve", "--model-repository=models", "--backend-directory=/opt/tritonserver/backends",
        "--backend-config=python,stub-timeout-seconds=120",
        "--backend-config=onnxruntime,default-max-batch-size=4", "--id", "inference-a",
        "--rate-limit=execution_count", "--cuda-memory-pool-byte-size", "0:67108864",
        "--pinned-memory-pool-byte-size=0", "--reuse-grpc-port=true", "--model-namespacing=0",
        "--response-cache-byte-size", "1024",
    ]  # fmt: skip
    with caplog.at_level(logging.INFO):
        assert run(build_parser().parse_args(argv)) == 0
    ignored = [r.__dict__["flag"] for r in caplog.records if "accepted and ignored" in r.message]
    assert ignored == [
        "--backend-directory", "--cuda-memory-pool-byte-size",
        "--pinned-memory-pool-byte-size",
    ]  # fmt: skip
    [settings] = started
    assert settings.reuse_grpc_port
    assert settings.rate_limit == "execution_count"
    assert settings.backend_config == (
        "python,stub-timeout-seconds=120",
        "onnxruntime,default-max-batch-size=4",
    )
    assert settings.server_id == "inference-a"
    assert settings.cache_bytes() == 1024
    assert "'--cache-config=local,size=1024'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (["--response-cache-byte-size", "8", "--cache-config", "local,size=8"],
         "Error: Incompatible flags --response-cache-byte-size and --cache-config both provided"),
        (["--model-namespacing", "true"], "does not namespace models"),
    ],
)  # fmt: skip
def test_triton_flags_batchserve_cannot_honour_stop_the_start(
    argv: list[str], refusal: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(build_parser().parse_args(["serve", *argv])) == 2
    assert refusal in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--cuda-memory-pool-byte-size", "64MB"), ("--model-load-thread-count", "four")],
)  # fmt: skip
def test_an_ignored_flags_value_is_still_checked_as_triton_checks_it(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", flag, value])
    assert flag in capsys.readouterr().err


def test_tritons_grpc_ssl_flags_secure_grpc_alone(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    files = ["--grpc-server-cert", str(pki.server.cert_file),
             "--grpc-server-key", str(pki.server.key_file)]  # fmt: skip
    plain_root = _settings("--grpc-use-ssl", "1", *files, "--grpc-root-cert", str(pki.ca.cert_file))
    assert plain_root.tls is None
    assert plain_root.grpc_tls is not None
    assert plain_root.grpc_tls.mode == TlsMode.TLS
    mutual = _settings("--grpc-use-ssl-mutual=true", *files, "--grpc-root-cert",
                       str(pki.ca.cert_file))  # fmt: skip
    assert mutual.grpc_tls is not None
    assert mutual.grpc_tls.mode == TlsMode.MUTUAL
    both = _settings(*files, "--tls-cert-file", str(pki.server.cert_file), "--tls-key-file",
                     str(pki.server.key_file))  # fmt: skip
    assert both.grpc_tls == both.tls  # without Triton's switch, the --tls-* files serve both
    with pytest.raises(ValidationError, match="need --grpc-server-cert and --grpc-server-key"):
        _settings("--grpc-use-ssl", "true")
    with pytest.raises(ValidationError, match="--grpc-use-ssl-mutual needs --grpc-root-cert"):
        _settings("--grpc-use-ssl-mutual", "true", *files)
    with pytest.raises(ValidationError, match="holds no PEM certificate"):
        _settings("--grpc-use-ssl", "true", "--grpc-server-cert", str(pki.server.key_file),
                  "--grpc-server-key", str(pki.server.key_file))  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "words"),
    [(["--http-port", "8005", "--grpc-port", "8005"],
      "listen to HTTP requests and GRPC requests at the same address and port 127.0.0.1:8005"),
     (["--grpc-port", "8002"],
      "listen to GRPC requests and metrics requests at the same address and port 127.0.0.1:8002")],
)  # fmt: skip
def test_two_listeners_on_one_port_are_refused_in_tritons_words(
    argv: list[str], words: str
) -> None:
    with pytest.raises(ValidationError, match=f"The server cannot {words}"):
        _settings(*argv)
    _settings("--grpc-port", "8002", "--allow-metrics", "false")  # no metrics port, no clash
    _settings("--http-port", "8005", "--grpc-port", "8005", "--grpc-address", "127.0.0.2")


def test_rate_limit_flags_are_read_and_checked_in_tritons_words() -> None:
    settings = _settings(
        "--rate-limit", "EXECUTION_COUNT", "--rate-limit-resource", "resource1:4",
        "--rate-limit-resource", "resource2:2:1",
    )  # fmt: skip
    assert settings.rate_limit == "execution_count"
    assert settings.rate_limit_resources() == {("resource1", -1): 4, ("resource2", 1): 2}
    assert _settings().rate_limit == "off"
    with pytest.raises(ValidationError, match="invalid argument for --rate-limit"):
        _settings("--rate-limit", "sometimes")
    with pytest.raises(ValidationError, match="--rate-limit-resource option format is"):
        _settings("--rate-limit-resource", "resource1")


def test_backend_config_entries_are_checked_in_tritons_words() -> None:
    with pytest.raises(ValidationError, match="No backend specified"):
        _settings("--backend-config", ",default-max-batch-size=4")
    with pytest.raises(ValidationError, match="option format is '<backend name>,<setting>"):
        _settings("--backend-config", "onnxruntime,default-max-batch-size")
    with pytest.raises(ValidationError, match="default-max-batch-size must be a count"):
        _settings("--backend-config", "default-max-batch-size=-1")


@pytest.mark.parametrize("protocol", ["http", "grpc", "metrics"])
def test_a_port_is_checked_only_where_its_protocol_is_served(protocol: str) -> None:
    """Triton's L0_socket starts ``--http-port -47 --allow-http 0`` ("allow illegal
    http/grpc port if disabled"); served, the same port stops the start by name."""
    assert getattr(_settings(f"--{protocol}-port", "-47", f"--allow-{protocol}", "0"),
                   f"{protocol}_port") == -47  # fmt: skip
    for port in ("-47", "65536"):
        with pytest.raises(ValidationError, match=f"--{protocol}-port {port} is not a port"):
            _settings(f"--{protocol}-port", port)


def test_waiting_out_the_queue_delay_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_environment(monkeypatch)
    assert _settings().wait_out_queue_delay is False
    assert _settings("--wait-out-queue-delay", "true").wait_out_queue_delay is True
    monkeypatch.setenv("BATCHSERVE_WAIT_OUT_QUEUE_DELAY", "1")
    assert _settings().wait_out_queue_delay is True


def test_the_scheduler_delay_for_tests_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--delay-scheduler N``: Triton's ``TRITONSERVER_DELAY_SCHEDULER``; never negative."""
    _clear_environment(monkeypatch)
    assert _settings().delay_scheduler == 0
    assert _settings("--delay-scheduler", "3").delay_scheduler == 3
    monkeypatch.setenv("BATCHSERVE_DELAY_SCHEDULER", "6")
    assert _settings().delay_scheduler == 6
    with pytest.raises(ValidationError, match="delay_scheduler"):
        _settings("--delay-scheduler", "-1")
    assert _settings().backlog_delay_scheduler == 0
    assert _settings("--backlog-delay-scheduler", "2").backlog_delay_scheduler == 2
