"""``--delay-scheduler`` (Triton's ``TRITONSERVER_DELAY_SCHEDULER``) on a real server, and
Triton's preferred-size rule with no queue delay, as its ``L0_batcher`` checks them: the
requests are all queued before the first batch forms, which then takes the largest preferred
size the queue reaches, the rest going next. One process and two workers, tritonclient over
HTTP and gRPC: the hold counts the requests every worker hands over, whichever protocol."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.server import MODEL_REPO, start_server


def _repository(tmp_path: Path) -> Path:
    """digits_cnn as shipped, but with preferred sizes 4 and 6 and no queue delay."""
    target = tmp_path / "digits_cnn"
    shutil.copytree(MODEL_REPO / "digits_cnn", target)
    config = target / "config.pbtxt"
    shipped = "max_queue_delay_microseconds: 25000"
    text = config.read_text()
    assert shipped in text
    config.write_text(text.replace(shipped, "preferred_batch_size: [4, 6]"))
    return tmp_path


def _ask_together(url: str, protocol: str, count: int) -> list[np.ndarray]:
    """``count`` requests at once, each from its own client; their answers in order."""
    module: Any = grpcclient if protocol == "grpc" else httpclient

    def ask(index: int) -> np.ndarray:
        client = module.InferenceServerClient(url)
        image = module.InferInput("image", [1, 1, 8, 8], "FP32")
        image.set_data_from_numpy(np.full((1, 1, 8, 8), index / count, dtype=np.float32))
        result = client.infer("digits_cnn", [image])
        client.close()
        answer: np.ndarray | None = result.as_numpy("logits")
        assert answer is not None
        return answer

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(ask, range(count)))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize(("count", "batches"), [(5, {4: 1, 1: 1}), (7, {6: 1, 1: 1})])
def test_held_requests_go_as_the_largest_preferred_size_then_the_rest(
    tmp_path: Path, count: int, batches: dict[int, int], workers: str, protocol: str
) -> None:
    flags = ["--delay-scheduler", str(count), "--workers", workers]
    server = start_server(_repository(tmp_path), flags)
    url = server.grpc_url if protocol == "grpc" else server.http_url
    try:
        answers = _ask_together(url, protocol, count)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        stats = client.get_inference_statistics("digits_cnn", as_json=True)["model_stats"][0]
        alone = _ask_together(url, protocol, 1)  # the hold was once: a lone request goes
        client.close()
    finally:
        assert server.stop() == 0
    executed = {
        int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]
    }
    assert executed == batches
    assert int(stats["inference_count"]) == count
    assert len({answer.tobytes() for answer in answers}) == count  # each its own image's
    assert alone[0].shape == answers[0].shape
