"""A repository holding FIFOs and oversized files: each load is refused at once with a 400
naming the file and the limit, serving goes on, and the server still stops promptly.

A FIFO opened for reading waits for a writer, so before these checks a load hung for good and
SIGTERM never ended the process; a 50 MB config.pbtxt was parsed holding the GIL for 18 s.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.server import CONTROL_TOKEN, MODEL_REPO, ServerProcess, start_server

HEADERS = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
WARMUP = """
model_warmup [{
  name: "from_file" batch_size: 1
  inputs { key: "image" value: { data_type: TYPE_FP32 dims: [1, 8, 8] input_data_file: "w" } }
}]
"""


def _digits(repo: Path, name: str, extra_config: str = "") -> Path:
    model = repo / name
    shutil.copytree(MODEL_REPO / "digits_cnn", model)
    config = (model / "config.pbtxt").read_text().replace('"digits_cnn"', f'"{name}"')
    (model / "config.pbtxt").write_text(config + extra_config)
    return model


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("hostile_repo")
    _digits(repo, "digits_cnn")
    fifo_config = _digits(repo, "fifo_config")
    (fifo_config / "config.pbtxt").unlink()
    os.mkfifo(fifo_config / "config.pbtxt")
    big = _digits(repo, "big_config")
    entry = 'parameters { key: "k" value { string_value: "v" } }\n'
    (big / "config.pbtxt").write_text(entry * (2 * (1 << 20) // len(entry)))
    fifo_warmup = _digits(repo, "fifo_warmup", WARMUP)
    (fifo_warmup / "warmup").mkdir()
    os.mkfifo(fifo_warmup / "warmup" / "w")
    big_warmup = _digits(repo, "big_warmup", WARMUP)
    (big_warmup / "warmup").mkdir()
    with (big_warmup / "warmup" / "w").open("wb") as sparse:  # holes: no disk is used
        sparse.truncate((256 << 20) + 1)
    fifo_labels = _digits(repo, "fifo_labels")
    config = (fifo_labels / "config.pbtxt").read_text()
    labelled = config.replace('name: "logits"', 'name: "logits"\n  label_filename: "labels.txt"')
    (fifo_labels / "config.pbtxt").write_text(labelled)
    os.mkfifo(fifo_labels / "labels.txt")
    args = ["--model-control-mode", "explicit", "--load-model", "digits_cnn"]
    server = start_server(repo, args, extra_env={"BATCHSERVE_CONTROL_TOKEN": CONTROL_TOKEN})
    yield server
    started = time.monotonic()
    assert server.stop(timeout=20) == 0
    assert time.monotonic() - started < 10  # no load is left hanging on a FIFO


def _load(server: ServerProcess, model: str) -> httpx.Response:
    url = f"http://{server.http_url}/v2/repository/models/{model}/load"
    return httpx.post(url, headers=HEADERS, timeout=10)


@pytest.mark.parametrize(
    ("model", "problem"),
    [
        ("fifo_config", "fifo_config/config.pbtxt: is not a regular file"),
        (
            "big_config",
            "big_config/config.pbtxt: is larger than 1048576 bytes (the limit on config.pbtxt)",
        ),
        ("fifo_warmup", "input_data_file warmup/w is not a regular file"),
        (
            "big_warmup",
            "input_data_file warmup/w is larger than 268435456 bytes "
            "(the limit on a warm-up data file)",
        ),
        ("fifo_labels", "label_filename 'labels.txt': does not exist or is not a file"),
    ],
)
def test_an_unusable_file_fails_its_load_at_once_with_a_400_naming_it(
    hostile: ServerProcess, model: str, problem: str
) -> None:
    started = time.monotonic()
    response = _load(hostile, model)
    assert time.monotonic() - started < 5
    assert response.status_code == 400
    assert problem in response.json()["error"]
    live = httpx.get(f"http://{hostile.http_url}/v2/health/live", timeout=5)
    assert live.status_code == 200
    body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8],
                        "data": [0.0] * 64}]}  # fmt: skip
    infer = httpx.post(f"http://{hostile.http_url}/v2/models/digits_cnn/infer", json=body)
    assert infer.status_code == 200
