"""NVIDIA's Python client examples this suite cannot mirror yet, and what each waits for.

batchserve has no sequence batcher (Triton's ``sequence_batching``: sequence ids, start
and end flags, per-sequence state), no decoupled models (several responses to one
request) and no ensembles. Each example that needs one of them is listed here, skipped
with its reason, so that it is mirrored when the feature lands instead of being forgotten.
Every other example of ``src/python/examples`` has a test in this package named after it.
"""

from __future__ import annotations

import pytest

WAITING = {
    "simple_grpc_sequence_stream_infer_client": "waiting for sequence batching",
    "simple_grpc_sequence_sync_infer_client": "waiting for sequence batching",
    "simple_http_sequence_sync_infer_client": "waiting for sequence batching",
    "simple_grpc_aio_sequence_stream_infer_client": "waiting for sequence batching",
    "simple_grpc_custom_repeat": "waiting for decoupled models (repeat_int32)",
    "ensemble_image_client": "waiting for ensembles (preprocess_inception_ensemble)",
}


@pytest.mark.parametrize(
    "example",
    [pytest.param(name, marks=pytest.mark.skip(reason=reason)) for name, reason in WAITING.items()],
)
def test_waiting_for_a_feature(example: str) -> None:
    raise AssertionError(f"{example}: mirror this example now that its feature exists")
