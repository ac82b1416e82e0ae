"""The collector as the server runs it: startup objects frozen, young collections rare."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.http as httpclient

from tests.integration.server import ServerProcess, metric

CLIENTS = 32
REQUESTS_EACH = 60
MOST_YOUNG_COLLECTIONS = 10
"""What 32 clients in flight cost with CPython's default threshold (700): ~50 young
collections for these ~2,000 requests. One client at a time sets off none either way: what a
request allocates is freed before the next one starts."""


def test_the_loaded_server_froze_what_it_started_with(server: ServerProcess) -> None:
    frozen = [record for record in server.logs if record.get("message") == "heap frozen"]
    assert frozen, "no 'heap frozen' record after the models loaded"
    assert int(str(frozen[-1]["frozen_objects"])) > 20_000


def _client(url: str) -> int:
    """``REQUESTS_EACH`` binary requests one after the other; the answers that came back."""
    image = httpclient.InferInput("image", [1, 1, 8, 8], "FP32")
    image.set_data_from_numpy(np.ones((1, 1, 8, 8), np.float32), binary_data=True)
    wanted = [httpclient.InferRequestedOutput("probabilities", binary_data=True)]
    client = httpclient.InferenceServerClient(url)
    try:
        answers = [
            client.infer("digits_cnn", [image], outputs=wanted) for _ in range(REQUESTS_EACH)
        ]
    finally:
        client.close()
    return sum(a.as_numpy("probabilities") is not None for a in answers)


def test_requests_in_flight_do_not_set_off_young_collections(server: ServerProcess) -> None:
    before = metric(server, "python_gc_collections_total", generation="0")
    with ThreadPoolExecutor(CLIENTS) as pool:
        answered = sum(pool.map(_client, [server.http_url] * CLIENTS))
    after = metric(server, "python_gc_collections_total", generation="0")
    assert answered == CLIENTS * REQUESTS_EACH
    assert after - before <= MOST_YOUNG_COLLECTIONS
