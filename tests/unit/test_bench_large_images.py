"""bench.large_images: the images it sends, the config it raises, and the file it writes."""

from __future__ import annotations

from pathlib import Path

from batchserve.models.model_config import load_pbtxt

from bench.large_images import GROUPS, MODEL, RAISED_PIXELS, SHAPES, raised_copy, render, requests
from bench.memory_rounds import Round


def test_the_images_are_seeded_in_the_mixed_shapes() -> None:
    sent = requests()
    assert len(sent) == GROUPS * len(SHAPES)
    assert [images.shape for images in sent[: len(SHAPES)]] == [
        (rows, 3, side, side) for rows, side in SHAPES
    ]
    assert all((a == b).all() for a, b in zip(sent, requests(), strict=True))
    assert 64 * max(side * side for _, side in SHAPES) <= RAISED_PIXELS


def test_the_raised_copy_sets_max_batch_steps_and_the_exported_one_does_not(
    tmp_path: Path,
) -> None:
    exported = tmp_path / "exported"
    exported.mkdir()
    (exported / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nmax_batch_size: 64\n'
        'input [{ name: "image" data_type: TYPE_FP32 dims: [3, -1, -1] }]\n'
        "dynamic_batching { }\n"
    )
    for name, pixels in (("raised", RAISED_PIXELS), ("bounded", 0)):
        (tmp_path / name).mkdir()
        raised_copy(exported, tmp_path / name, pixels)
    raised = load_pbtxt(tmp_path / "raised" / MODEL / "config.pbtxt")
    bounded = load_pbtxt(tmp_path / "bounded" / MODEL / "config.pbtxt")
    assert raised.batchserve.max_batch_steps == RAISED_PIXELS
    assert bounded.batchserve.max_batch_steps == 0
    assert list(raised.input[0].dims) == list(bounded.input[0].dims) == [3, -1, -1]


def test_the_report_has_every_round_and_the_medians_of_each_setting() -> None:
    rounds = [Round("bounded", 20.0, 900.0, 1000.0), Round("raised", 10.0, 900.0, 3000.0)]
    text = render(rounds, 32)
    assert "| 1 | bounded | 20.00 | 900 | 1,000 |" in text
    assert "bounded 20.00 s and 100 MiB above the loaded model at the peak" in text
    assert "raised 10.00 s and 2,100 MiB; time bounded / raised 2.00." in text
