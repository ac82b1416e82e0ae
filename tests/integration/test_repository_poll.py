"""Triton's poll mode on a real server, as Triton's own deployment charts start it
(``--model-control-mode=poll --repository-poll-secs=...``) and as L0_lifecycle's poll tests
change the repository under it: a model added is served, a version added replaces the one
the version policy drops (a request for that one is "not at ready state"), a model removed
is unloaded, and the load API is refused as Triton refuses it while polling."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import MODEL_REPO, start_server


def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the server did not follow the repository in time"
        time.sleep(0.2)


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one-process", "two-workers"])
def test_the_server_follows_the_repository(tmp_path: Path, workers: str) -> None:
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    server = start_server(
        tmp_path,
        ["--model-control-mode=poll", "--repository-poll-secs=1", "--workers", workers],
    )
    try:
        http = httpclient.InferenceServerClient(server.http_url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as refused:
            http.load_model("digits_cnn")
        assert refused.value.message().startswith(
            "explicit model load / unload is not allowed if polling is enabled"
        )
        shutil.copytree(MODEL_REPO / "char_lstm", tmp_path / "char_lstm")
        _until(lambda: http.is_model_ready("char_lstm"))
        shutil.copytree(tmp_path / "digits_cnn" / "1", tmp_path / "digits_cnn" / "2")
        _until(lambda: http.is_model_ready("digits_cnn", "2"))
        assert not grpc.is_model_ready("digits_cnn", "1")  # the policy serves the latest one
        image = httpclient.InferInput("image", [1, 1, 8, 8], "FP32")
        image.set_data_from_numpy(np.zeros((1, 1, 8, 8), np.float32))
        with pytest.raises(InferenceServerException, match="version 1 is not at ready state"):
            http.infer("digits_cnn", [image], model_version="1")
        assert http.infer("digits_cnn", [image]).get_response()["model_version"] == "2"
        shutil.rmtree(tmp_path / "char_lstm")
        _until(lambda: not grpc.is_model_ready("char_lstm"))
        assert http.is_server_ready(), "a model unloaded by the repository is not a failure"
    finally:
        assert server.stop() == 0
