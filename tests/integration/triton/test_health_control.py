"""Health, metadata and model-control examples of NVIDIA's Python client, over HTTP and gRPC.

The model-control examples count the models of the repository they ran against (7 in the
HTTP example, 8 in the gRPC one: Triton's docs repository at two dates); here the count is
that of the repository this suite builds.
"""

from __future__ import annotations

import grpc
import pytest
from tritonclient.utils import InferenceServerException

from tests.integration.server import ServerProcess
from tests.integration.triton.checks import TIMEOUT, grpc_client, http_client
from tests.integration.triton.models import MODEL_NAMES

QUERY = {"test_1": 1, "test_2": 2}
HEADERS = {"test": "1", "dummy": "2"}


def test_simple_http_health_metadata_unknown_model(triton_server: ServerProcess) -> None:
    """The example's metadata request for a wrong model name: refused in Triton's words."""
    client = http_client(triton_server.http_url)
    with pytest.raises(InferenceServerException) as error:
        client.get_model_metadata("wrong_model_name")
    assert "Request for unknown model" in error.value.message(), error.value.message()


def test_simple_http_health_metadata(triton_server: ServerProcess) -> None:
    client = http_client(triton_server.http_url)
    assert client.is_server_live(query_params=QUERY)
    assert client.is_server_ready(), "not ready: every model of the repository must have loaded"
    assert client.is_model_ready("simple")
    metadata = client.get_server_metadata()
    assert metadata["name"] == "triton", metadata
    metadata = client.get_model_metadata("simple", query_params=QUERY)
    assert metadata["name"] == "simple", metadata


def test_simple_grpc_health_metadata_unknown_model(triton_server: ServerProcess) -> None:
    """The example's metadata request for a wrong model name: refused in Triton's words."""
    client = grpc_client(triton_server.grpc_url)
    with pytest.raises(InferenceServerException) as error:
        client.get_model_metadata("wrong_model_name", client_timeout=TIMEOUT)
    assert "Request for unknown model" in error.value.message(), error.value.message()


def test_simple_grpc_health_metadata(triton_server: ServerProcess) -> None:
    client = grpc_client(triton_server.grpc_url)
    assert client.is_server_live(headers=HEADERS, client_timeout=TIMEOUT)
    assert client.is_server_ready(client_timeout=TIMEOUT), "not ready: a model failed to load"
    assert client.is_model_ready("simple", client_timeout=TIMEOUT)
    metadata = client.get_server_metadata(client_timeout=TIMEOUT)
    assert metadata.name == "triton", metadata
    metadata = client.get_model_metadata("simple", headers=HEADERS, client_timeout=TIMEOUT)
    assert metadata.name == "simple", metadata
    config = client.get_model_config("simple", client_timeout=TIMEOUT)
    assert config.config.name == "simple", config


BAD_OVERRIDE = '"parameters": {"config": {{"max_batch_size": "16"}}}'
"""Not JSON: the examples pass it to check that a bad override is refused."""
OVERRIDE = '{"max_batch_size":"16"}'


def test_simple_http_model_control(control_server: ServerProcess) -> None:
    client = http_client(control_server.http_url)
    index = client.get_model_repository_index()
    assert sorted(entry["name"] for entry in index) == sorted(MODEL_NAMES), index
    client.load_model("simple")
    assert client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as error:
        client.load_model("simple", config=BAD_OVERRIDE)
    assert "failed to load" in error.value.message(), error.value.message()
    client.load_model("simple", config=OVERRIDE)
    config = client.get_model_config("simple")
    assert config["max_batch_size"] == 16, config
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as error:
        client.load_model("wrong_model_name")
    assert "failed to load" in error.value.message(), error.value.message()


def test_simple_grpc_model_control(control_server: ServerProcess) -> None:
    client = grpc_client(control_server.grpc_url)
    index = client.get_model_repository_index(client_timeout=TIMEOUT)
    assert sorted(model.name for model in index.models) == sorted(MODEL_NAMES), index
    client.load_model("simple", client_timeout=TIMEOUT)
    assert client.is_model_ready("simple", client_timeout=TIMEOUT)
    with pytest.raises(InferenceServerException) as error:
        client.load_model("simple", config=BAD_OVERRIDE, client_timeout=TIMEOUT)
    assert "failed to load" in error.value.message(), error.value.message()
    client.load_model("simple", config=OVERRIDE, client_timeout=TIMEOUT)
    config = client.get_model_config("simple", client_timeout=TIMEOUT)
    assert config.config.max_batch_size == 16, config
    client.unload_model("simple", client_timeout=TIMEOUT)
    assert not client.is_model_ready("simple", client_timeout=TIMEOUT)

    # A file override whose path is too long: refused as Triton refuses it, server still live.
    long_path = "file:" + "A" * 256
    with pytest.raises(InferenceServerException) as error:
        client.load_model("simple", config="{}", files={long_path: b"a"}, client_timeout=TIMEOUT)
    assert error.value.status() == str(grpc.StatusCode.INTERNAL), error.value
    assert "failed to poll from model repository" in error.value.message(), error.value.message()
    assert client.is_server_live(client_timeout=TIMEOUT)

    with pytest.raises(InferenceServerException) as error:
        client.load_model("wrong_model_name", client_timeout=TIMEOUT)
    assert "failed to load" in error.value.message(), error.value.message()
