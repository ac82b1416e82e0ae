"""Triton's trace and log settings APIs through the real Triton clients, and log settings
changing what the server really writes."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import CONTROL_TOKEN, MODEL_REPO, ServerProcess, start_server

HEADERS = {"authorization": f"Bearer {CONTROL_TOKEN}"}
TRACE_DEFAULTS = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "trace_mode": "opentelemetry",
}
"""As Triton answers them in its ``opentelemetry`` mode: no ``log_frequency`` or
``trace_file``, which only its ``triton`` mode (trace files) has."""
LOG_DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "json",
}
Client = httpclient.InferenceServerClient | grpcclient.InferenceServerClient


@pytest.fixture(scope="module")
def settings_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Its own server: these tests change its logging and trace settings."""
    repo = tmp_path_factory.mktemp("settings_repo")
    shutil.copytree(MODEL_REPO / "digits_cnn", repo / "digits_cnn")
    args = ["--model-control-mode", "explicit", "--load-model", "digits_cnn"]
    server = start_server(repo, args, extra_env={"BATCHSERVE_CONTROL_TOKEN": CONTROL_TOKEN})
    yield server
    assert server.stop() == 0


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, settings_server: ServerProcess) -> Client:
    if request.param == "http":
        return httpclient.InferenceServerClient(settings_server.http_url)
    return grpcclient.InferenceServerClient(settings_server.grpc_url)


def _trace(client: Client, model: str = "", **settings: object) -> dict[str, object]:
    """Triton's answer, the same dict from either client (gRPC's values are lists)."""
    if isinstance(client, httpclient.InferenceServerClient):
        if settings:
            return dict(client.update_trace_settings(model, settings, headers=HEADERS))
        return dict(client.get_trace_settings(model))
    if settings:
        answer = client.update_trace_settings(model, settings, headers=HEADERS, as_json=True)
    else:
        answer = client.get_trace_settings(model, as_json=True)
    values = {k: v["value"] for k, v in answer["settings"].items()}
    return {k: v if k == "trace_level" else v[0] if v else "" for k, v in values.items()}


def _log(client: Client, **settings: object) -> dict[str, object]:
    if isinstance(client, httpclient.InferenceServerClient):
        if settings:
            return dict(client.update_log_settings(settings, headers=HEADERS))
        return dict(client.get_log_settings())
    if settings:
        answer = client.update_log_settings(settings, headers=HEADERS, as_json=True)
    else:
        answer = client.get_log_settings(as_json=True)
    values = {k: next(iter(v.values()), "") for k, v in answer["settings"].items()}
    return {k: int(v) if k == "log_verbose_level" else v for k, v in values.items()}


def _status(error: pytest.ExceptionInfo[InferenceServerException]) -> str:
    return str(error.value.status()).removeprefix("StatusCode.")


def test_trace_settings_are_triton_s_defaults_with_tracing_off(client: Client) -> None:
    assert _trace(client) == TRACE_DEFAULTS
    assert _trace(client, "digits_cnn") == TRACE_DEFAULTS


def test_trace_settings_round_trip_globally_and_per_model(client: Client) -> None:
    assert _trace(client, trace_rate="5", trace_level=["OFF"])["trace_rate"] == "5"
    assert _trace(client, "digits_cnn", trace_count="3")["trace_count"] == "3"
    assert _trace(client, "digits_cnn")["trace_rate"] == "5"  # inherited from global
    assert _trace(client)["trace_count"] == "-1"
    _trace(client, "digits_cnn", trace_count=None)
    assert _trace(client, trace_rate=None) == TRACE_DEFAULTS
    assert _trace(client, "digits_cnn") == TRACE_DEFAULTS


@pytest.mark.parametrize(
    ("settings", "status", "words"),
    [
        ({"trace_level": ["LOUD"]}, ("400", "INVALID_ARGUMENT"), "unknown trace level 'LOUD'"),
        ({"trace_mode": "triton"}, ("400", "INVALID_ARGUMENT"), "'trace_mode' can not be"),
        ({"trace_file": "t.json"}, ("501", "UNIMPLEMENTED"), "trace file location can not be"),
        ({"trace_rate": "often"}, ("400", "INVALID_ARGUMENT"), "Unable to parse 'trace_rate'"),
        ({"sample": "1"}, ("400", "INVALID_ARGUMENT"), "unknown trace setting 'sample'"),
    ],
)
def test_bad_trace_updates_are_refused(
    client: Client, settings: dict[str, object], status: tuple[str, str], words: str
) -> None:
    with pytest.raises(InferenceServerException) as error:
        _trace(client, **settings)
    assert _status(error) in status
    assert words in error.value.message()
    assert _trace(client) == TRACE_DEFAULTS


def test_a_trace_level_switches_tracing_on_per_model_and_off_again(client: Client) -> None:
    """The level round trips through both clients; spans are tested in test_tracing.py."""
    answer = _trace(client, "digits_cnn", trace_level=["TIMESTAMPS", "TENSORS"])
    assert answer["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    assert _trace(client)["trace_level"] == ["OFF"]  # the global level is untouched
    _trace(client, "digits_cnn", trace_level=None)
    assert _trace(client, "digits_cnn") == TRACE_DEFAULTS


def test_trace_settings_of_an_unknown_model_use_triton_s_words(client: Client) -> None:
    with pytest.raises(InferenceServerException) as error:
        _trace(client, "absent")
    assert _status(error) in ("400", "INVALID_ARGUMENT")
    assert error.value.message() == "Request for unknown model : absent"


def test_log_settings_round_trip(client: Client) -> None:
    assert _log(client) == LOG_DEFAULTS
    assert _log(client, log_warning=False, log_verbose_level=2) == {
        **LOG_DEFAULTS,
        "log_warning": False,
        "log_verbose_level": 2,
    }
    assert _log(client, log_warning=True, log_verbose_level=0) == LOG_DEFAULTS


@pytest.mark.parametrize(
    ("settings", "status", "words"),
    [
        ({"log_file": "server.log"}, ("501", "UNIMPLEMENTED"), "log file location can not be"),
        ({"log_format": "iso8601"}, ("400", "INVALID_ARGUMENT"), "invalid argument for log_format"),
    ],
)
def test_bad_log_updates_are_refused(
    client: Client, settings: dict[str, object], status: tuple[str, str], words: str
) -> None:
    with pytest.raises(InferenceServerException) as error:
        _log(client, **settings)
    assert _status(error) in status
    assert words in error.value.message()
    assert _log(client) == LOG_DEFAULTS


def test_updates_need_the_control_token_and_reads_do_not(settings_server: ServerProcess) -> None:
    base = f"http://{settings_server.http_url}"
    for path, body in (("/v2/logging", {"log_info": False}), ("/v2/trace/setting", {})):
        assert httpx.get(base + path).status_code == 200
        assert httpx.post(base + path, json=body).status_code == 401
    grpc = grpcclient.InferenceServerClient(settings_server.grpc_url)
    with pytest.raises(InferenceServerException, match="valid token"):
        grpc.update_log_settings({"log_info": False})
    assert grpc.get_log_settings(as_json=True)["settings"]["log_info"]["bool_param"] is True


def test_log_switches_change_what_the_server_writes(settings_server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(settings_server.http_url)
    grpc = grpcclient.InferenceServerClient(settings_server.grpc_url)
    settings_server.drain_logs()
    start = len(settings_server.logs)
    http.update_log_settings({"log_info": False}, headers=HEADERS)
    http.load_model("digits_cnn", headers=HEADERS)  # its "model ready" is switched off
    grpc.update_log_settings({"log_info": True, "log_verbose_level": 1}, headers=HEADERS)
    grpc.load_model("digits_cnn", headers=HEADERS)
    settings_server.wait_for("model ready")
    records = settings_server.logs[start:]
    assert [r["message"] for r in records].count("model ready") == 1
    debug = [r for r in records if r.get("level") == "DEBUG"]
    assert any("ignoring training.json" in str(r["message"]) for r in debug)

    grpc.update_log_settings({"log_verbose_level": 0, "log_format": "text"}, headers=HEADERS)
    http.load_model("digits_cnn", headers=HEADERS)
    http.update_log_settings({"log_format": "json"}, headers=HEADERS)
    http.load_model("digits_cnn", headers=HEADERS)
    settings_server.wait_for("model ready")
    lines = [str(r["message"]) for r in settings_server.logs[start + len(records) :]]
    text = [
        i
        for i, line in enumerate(lines)
        if "batchserve.models.registry: model ready (model=digits_cnn" in line
    ]
    assert text  # written as a text line, not JSON, with the call's fields
    assert not any("ignoring training.json" in line for line in lines[text[0] :])  # verbose 0
    assert http.get_log_settings() == LOG_DEFAULTS


def test_the_openapi_document_lists_the_settings_routes(settings_server: ServerProcess) -> None:
    paths = httpx.get(f"http://{settings_server.http_url}/openapi.json").json()["paths"]
    for route in ("/v2/logging", "/v2/trace/setting", "/v2/models/{name}/trace/setting"):
        assert set(paths[route]) == {"get", "post"}


def test_tritons_log_flags_at_start_are_what_its_logging_api_reports(tmp_path: Path) -> None:
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    server = start_server(tmp_path, ["--log-verbose=1", "--log-warning", "false"])
    try:
        with httpclient.InferenceServerClient(server.http_url) as http:
            answer = http.get_log_settings()
        server.drain_logs()
        levels = {str(record.get("level")) for record in server.logs}
    finally:
        assert server.stop() == 0
    assert answer == {**LOG_DEFAULTS, "log_verbose_level": 1, "log_warning": False}
    assert "DEBUG" in levels  # written from the start
