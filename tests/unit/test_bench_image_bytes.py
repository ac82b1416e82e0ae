"""bench.image_bytes: the request sizes it reports, and the results file it writes."""

from __future__ import annotations

import math

import numpy as np

from bench.image_bytes import (
    UINT8_IMAGE,
    VARIANTS,
    Measured,
    Variant,
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


def _point(model: str, protocol: str, throughput: float | None, cpu_s: float = 6.0) -> ServerPoint:
    row = PaRow(throughput, 25_000, 40_000, 0, 0) if throughput is not None else None
    return ServerPoint(
        "batchserve", model, protocol, 4, "on", row, requests=200, cpu_s=cpu_s, load1=1.5,
        error="" if row else "perf_analyzer did not finish within 90 s",
    )  # fmt: skip


def _measured(variant: Variant, protocol: str, size: int, *speeds: float | None) -> Measured:
    points = tuple(_point(variant.model, protocol, speed) for speed in speeds)
    return Measured(variant, protocol, 4, size, points)


def test_render_gives_medians_per_model_and_the_paired_uint8_to_fp32_ratios() -> None:
    measured = [
        _measured(FP32, "http", 602_263, 40.0, 20.0, 30.0),
        _measured(UINT8, "http", 150_680, 44.0, 22.0, 30.0),
        _measured(FP32, "grpc", 602_152, 38.0, 36.0, 37.0),
        _measured(UINT8, "grpc", 150_575, None, None, None),
    ]

    text = render(["Machine: test"], measured, ["a note"])

    assert text.startswith("# Images sent as bytes: FP32 vs UINT8 input\n\n- Machine: test\n")
    assert "Medians of 3 rounds" in text
    row = "| resnet18ish | FP32 3x224x224 | http | 602,263 | 4 | 30.0 (20.0-40.0) | 25.0 | 40.0 |"
    assert f"{row} 30.0 | 1.50-1.50 |" in text
    assert "| resnet18ish_uint8 | UINT8 224x224x3 | http | 150,680 | 4 | 30.0 (22.0-44.0) |" in text
    # each round's pair, then the median: 44/40, 22/20, 30/30
    assert "| http | 4 | 0.250 | 1.10 (1.00-1.10) | 1.00 (1.00-1.00) |" in text
    assert "| grpc | 4 | 0.250 | n/a | n/a |" in text
    assert "- resnet18ish_uint8 grpc c=4: perf_analyzer did not finish within 90 s" in text
    assert "- a note\n" in text


def test_a_model_with_no_figure_renders_nan_not_an_error() -> None:
    entry = _measured(UINT8, "grpc", 150_575, None)
    assert math.isnan(entry.median(lambda p: p.throughput))
