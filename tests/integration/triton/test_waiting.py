"""NVIDIA's Python client examples this suite cannot mirror yet, and what each waits for.

Each example that needs what batchserve lacks is listed here, skipped with its reason, so
that it is mirrored when the feature lands instead of being forgotten. (The
sequence and decoupled examples are mirrored in ``test_stateful.py``.)
Every other example of ``src/python/examples`` has a test in this package named after it.
"""

from __future__ import annotations

import pytest

WAITING = {
    "ensemble_image_client": (
        "waiting for an image decoder: its ensemble's first step decodes the JPEG files the "
        "client sends as BYTES, and ONNX Runtime implements no ImageDecoder (opset 20); the "
        "ensemble flow itself is tested in tests/integration/test_ensembles.py"
    ),
}


@pytest.mark.parametrize(
    "example",
    [pytest.param(name, marks=pytest.mark.skip(reason=reason)) for name, reason in WAITING.items()],
)
def test_waiting_for_a_feature(example: str) -> None:
    raise AssertionError(f"{example}: mirror this example now that its feature exists")
