"""Named configs (``--model-config-name``) and instance changes without a reload, through
NVIDIA's clients, on a server whose requests are handled by two worker processes.

A load whose config differs only in ``instance_group`` changes the instances of the model
being served: under steady traffic, none of it fails, the model never stops being ready, and
its statistics carry on. A change whose new instances do not fit the memory budget is
refused and the instances loaded before keep serving.
"""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from tests.integration.server import CONTROL_TOKEN, MODEL_REPO, ServerProcess, start_server

HEADERS = {"authorization": f"Bearer {CONTROL_TOKEN}"}
MODEL = "digits_cnn"
WIDE, WIDE_COLUMNS = "wide", 262_144
"""A model answering 1 MiB per sample (``x @ W``, W 4 x WIDE_COLUMNS): its memory budget
holds one instance and a batch of a few dozen, then less than one more sample."""
WIDE_BUDGET = 32 * 1024 * 1024
CHANGED = "instances changed without a reload"


def _write_wide_model(repo: Path) -> None:
    weights = np.random.default_rng(0).standard_normal((4, WIDE_COLUMNS), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        WIDE,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDE_COLUMNS])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / WIDE / "1").mkdir(parents=True)
    onnx.save(model, str(repo / WIDE / "1" / "model.onnx"))
    (repo / WIDE / "config.pbtxt").write_text(
        f'name: "{WIDE}"\nmax_batch_size: 64\n'
        "instance_group [{ kind: KIND_CPU count: 1 }]\n"
        f"batchserve {{ memory_budget_bytes: {WIDE_BUDGET} }}\n"
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("instances_repo")
    shutil.copytree(MODEL_REPO / MODEL, repo / MODEL)
    _write_wide_model(repo)
    args = ["--model-control-mode", "explicit", "--load-model", MODEL, "--load-model", WIDE,
            "--model-config-name", "cpu", "--workers", "2"]  # fmt: skip
    process = start_server(repo, args, extra_env={"BATCHSERVE_CONTROL_TOKEN": CONTROL_TOKEN})
    yield process
    assert process.stop() == 0


def _config(server: ServerProcess, model: str = MODEL) -> dict[str, object]:
    response = httpx.get(f"http://{server.http_url}/v2/models/{model}/config", timeout=30)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _stats(server: ServerProcess, model: str = MODEL) -> dict[str, object]:
    response = httpx.get(f"http://{server.http_url}/v2/models/{model}/stats", timeout=30)
    return dict(response.json()["model_stats"][0])


def _successes(server: ServerProcess) -> int:
    return int(_stats(server)["inference_stats"]["success"]["count"])  # type: ignore[index]


def _instances(server: ServerProcess, model: str = MODEL) -> int:
    return len(_stats(server, model)["batchserve"]["instances"])  # type: ignore[index]


def _counted(config: dict[str, object], count: int) -> str:
    """The served config with another instance count: a load's ``config`` parameter."""
    changed = dict(config, instance_group=[{"kind": "KIND_CPU", "count": count}])
    return json.dumps(changed)


def test_the_named_config_is_served(server: ServerProcess) -> None:
    """configs/cpu.pbtxt, not config.pbtxt (which has no instance_group), over both
    protocols: the config API is answered by the process that loaded the model."""
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    expected = [{"kind": "KIND_CPU", "count": 2}]
    for config in (http.get_model_config(MODEL), grpc.get_model_config(MODEL, as_json=True)):
        groups = dict(config.get("config", config))["instance_group"]
        assert [{"kind": g["kind"], "count": int(g["count"])} for g in groups] == expected
    assert _instances(server) == 2


class _Traffic:
    """Clients calling infer over HTTP and gRPC without pause, and a watcher asking whether
    the model is ready, until stopped."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.ok = 0
        self.errors: list[str] = []
        self.not_ready = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._infer, args=(p,)) for p in [0, 1] * 2]
        self._threads.append(threading.Thread(target=self._watch_ready))

    def __enter__(self) -> _Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def wait_for(self, answers: int) -> None:
        deadline = time.monotonic() + 60
        target = self.ok + answers
        while self.ok < target and time.monotonic() < deadline and not self.errors:
            time.sleep(0.01)

    def _infer(self, use_grpc: int) -> None:
        module = grpcclient if use_grpc else httpclient
        url = self.server.grpc_url if use_grpc else self.server.http_url
        with module.InferenceServerClient(url) as client:  # closed in its own thread
            image = module.InferInput("image", [1, 1, 8, 8], "FP32")
            image.set_data_from_numpy(np.ones((1, 1, 8, 8), dtype=np.float32))
            while not self._stop.is_set():
                try:
                    result = client.infer(MODEL, [image])
                    assert result.as_numpy("probabilities").shape == (1, 10)
                except Exception as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    return
                with self._lock:
                    self.ok += 1

    def _watch_ready(self) -> None:
        with httpx.Client(base_url=f"http://{self.server.http_url}", timeout=30) as http:
            while not self._stop.is_set():
                if http.get(f"/v2/models/{MODEL}/ready").status_code != 200:
                    self.not_ready += 1
                time.sleep(0.01)


def test_instances_change_under_traffic_without_a_failure_or_a_reset(
    server: ServerProcess,
) -> None:
    config = _config(server)
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    before = _successes(server)
    seen = [before]
    with _Traffic(server) as traffic:
        for count, client in ((1, http), (3, grpc), (1, http)):
            traffic.wait_for(20)
            client.load_model(MODEL, headers=HEADERS, config=_counted(config, count))
            server.wait_for(CHANGED, timeout=30)
            served = _config(server)["instance_group"]
            assert [int(g["count"]) for g in served] == [count]  # type: ignore[union-attr]
            assert _instances(server) == count
            seen.append(_successes(server))
        traffic.wait_for(20)
    assert traffic.errors == []
    assert traffic.not_ready == 0, "the model was not ready at some point"
    assert all(later > earlier for earlier, later in itertools.pairwise(seen)), seen
    stats = _stats(server)
    assert _successes(server) - before == traffic.ok, "statistics carried on, none lost"
    assert stats["inference_stats"]["fail"]["count"] == 0  # type: ignore[index]
    assert not [r for r in server.logs if r.get("message") == "model reloaded whole"]


def test_a_change_that_does_not_fit_the_budget_is_refused_and_the_old_instance_serves(
    server: ServerProcess,
) -> None:
    config = _config(server, WIDE)
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match="memory_budget_bytes leaves") as refused:
        client.load_model(WIDE, headers=HEADERS, config=_counted(config, 2))
    assert f"load failed for model '{WIDE}'" in str(refused.value)  # Triton's, for a failed update
    assert client.is_model_ready(WIDE)
    assert _instances(server, WIDE) == 1
    assert [int(g["count"]) for g in _config(server, WIDE)["instance_group"]] == [1]  # type: ignore[union-attr]
    x = httpclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    assert client.infer(WIDE, [x]).as_numpy("y").shape == (1, WIDE_COLUMNS)
    index = {row["name"]: row for row in client.get_model_repository_index(headers=HEADERS)}
    assert index[WIDE]["state"] == "READY"
