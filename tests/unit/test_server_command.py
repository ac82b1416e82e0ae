import os
from pathlib import Path

import pytest
from batchserve.cli import build_parser
from batchserve.server_command import settings_from_args
from batchserve.settings import ClientShm, ModelControlMode, Settings
from pydantic import ValidationError


def _settings(*argv: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_defaults_follow_triton_and_listen_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("BATCHSERVE_"):
            monkeypatch.delenv(key)
    settings = _settings()
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (8000, 8001, 8002)
    assert settings.host == "127.0.0.1"
    assert settings.model_control_mode is ModelControlMode.NONE
    assert settings.model_repository == Path("model_repo")
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
