"""bench.large_inputs: the model it serves, the pairing of its rounds, and the file it writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench import repo
from bench.large_inputs import OFFSETS, SETTINGS, SIZES, Pair, render
from bench.records import PaRow, ServerPoint

DEFAULT, OFF = SETTINGS


def test_image_mean_takes_one_432_kib_image_and_returns_its_channel_means(tmp_path: Path) -> None:
    directory = repo.write_image_mean(tmp_path)
    session = ort.InferenceSession(str(directory / "1" / "model.onnx"))
    images = np.random.default_rng(0).random((2, *repo.IMAGE_CHW), dtype=np.float32)
    (means,) = session.run(None, {"image": images})
    np.testing.assert_allclose(means, images.mean(axis=(2, 3)), rtol=1e-5)
    assert images[0].nbytes == 432 * 1024
    assert "max_batch_size: 16" in (directory / "config.pbtxt").read_text()


def _point(throughput: float | None, cpu_s: float) -> ServerPoint:
    row = PaRow(throughput, 20_000, 30_000, 0, 0) if throughput is not None else None
    return ServerPoint(
        "batchserve", repo.IMAGE_MEAN, "grpc", 16, "on", row, requests=1000, cpu_s=cpu_s,
    )  # fmt: skip


def test_ratios_pair_each_round_and_skip_a_round_without_figures() -> None:
    pair = Pair(
        "grpc",
        {
            DEFAULT: [_point(500.0, 1.5), _point(600.0, 1.2), _point(None, 1.0)],
            OFF: [_point(600.0, 1.2), _point(600.0, 1.2), _point(700.0, 1.0)],
        },
    )
    assert pair.ratios("throughput") == [1.2, 1.0]
    assert pair.ratios("cpu_us_per_request") == [0.8, 1.0]
    assert pair.median(DEFAULT, "throughput") == 550.0  # the round without figures left out


def test_render_has_every_size_and_offset_and_the_paired_ratios() -> None:
    copies = {
        name: {(size, o): 10.0 + o * (name == DEFAULT) for size in SIZES.values() for o in OFFSETS}
        for name in SETTINGS
    }
    pair = Pair("grpc", {DEFAULT: [_point(500.0, 1.5)], OFF: [_point(600.0, 1.2)]})
    text = render(["Machine: test"], copies, [pair], 16, ["a note"])
    for label in SIZES:
        row = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
        assert row.endswith("| 10.0 | 26.0 | 10.0 | 10.0 |")
    assert "| grpc | 500 | 600 | 1.20 (1.20-1.20) | 1,500 | 1,200 | 0.80 (0.80-0.80) |" in text
    assert "- a note" in text
