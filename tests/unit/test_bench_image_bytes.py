"""bench.image_bytes: the request sizes it reports, and the results file it writes."""

from __future__ import annotations

import numpy as np

from bench.image_bytes import (
    UINT8_IMAGE,
    VARIANTS,
    Measured,
    grpc_request_bytes,
    http_request_bytes,
    render,
)
from bench.records import PaRow, ServerPoint

FP32, UINT8 = VARIANTS
IMAGE_BYTES = 224 * 224 * 3


def test_both_variants_carry_one_224x224_rgb_image() -> None:
    assert FP32.zeros().nbytes == 4 * IMAGE_BYTES
    assert UINT8.zeros().nbytes == IMAGE_BYTES
    assert UINT8.zeros().dtype == np.uint8
    assert "--normalize" in UINT8_IMAGE
    assert "image:UINT8:batch,224,224,3" in UINT8_IMAGE


def test_request_bytes_are_the_tensor_plus_a_small_envelope() -> None:
    for count in (http_request_bytes, grpc_request_bytes):
        for variant in VARIANTS:
            envelope = count(variant) - variant.zeros().nbytes
            assert 0 < envelope < 400, (count.__name__, variant.model, envelope)
        assert count(UINT8) < 0.26 * count(FP32)


def _point(model: str, protocol: str, throughput: float | None) -> ServerPoint:
    row = PaRow(throughput, 25_000, 40_000, 0, 0) if throughput is not None else None
    return ServerPoint(
        "batchserve", model, protocol, 4, "on", row, requests=200, cpu_s=6.0, load1=1.5,
        error="" if row else "perf_analyzer did not finish within 90 s",
    )  # fmt: skip


def test_render_gives_a_row_per_point_and_the_uint8_to_fp32_ratios() -> None:
    measured = [
        Measured(FP32, 602_263, _point(FP32.model, "http", 40.0)),
        Measured(UINT8, 150_680, _point(UINT8.model, "http", 42.0)),
        Measured(FP32, 602_152, _point(FP32.model, "grpc", 38.0)),
        Measured(UINT8, 150_575, _point(UINT8.model, "grpc", None)),
    ]

    text = render(["Machine: test"], measured, ["a note"])

    assert text.startswith("# Images sent as bytes: FP32 vs UINT8 input\n\n- Machine: test\n")
    assert (
        "| resnet18ish | FP32 3x224x224 | http | 602,263 | 4 | 40.0 | 25.0 | 40.0 | 30.0 | 1.50 |"
        in text
    )
    assert "| resnet18ish_uint8 | UINT8 224x224x3 | http | 150,680 | 4 | 42.0 |" in text
    assert "| http | 4 | 0.250 | 1.05 |" in text
    assert "| grpc | 4 | 0.250 | n/a |" in text
    assert "failed: 'perf_analyzer did not finish within 90 s'" in text
    assert text.endswith("- a note\n")
