"""The example architectures behave as their docstrings promise (no training here)."""

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from batchserve.zoo import char_lstm, digits_cnn  # noqa: E402


def test_encode_round_trips_printable_ascii_and_marks_the_rest_unknown() -> None:
    text = "def f(x):\n    return x  # ok"
    ids = char_lstm.encode(text)
    assert ids.dtype == np.int64
    assert "".join(char_lstm.decode_id(int(i)) for i in ids) == text
    assert char_lstm.encode("é\t").tolist() == [char_lstm.UNKNOWN, char_lstm.UNKNOWN]
    assert ids.max() < char_lstm.VOCAB_SIZE


def test_padding_after_a_rows_end_does_not_change_its_answer() -> None:
    torch.manual_seed(0)
    model = char_lstm.CharLSTM(embed=8, hidden=16, layers=2).eval()
    short = torch.from_numpy(char_lstm.encode("import os"))[None, :]
    long = torch.from_numpy(char_lstm.encode("from typing import Any"))[None, :]
    padded = torch.zeros((2, long.shape[1]), dtype=torch.int64)
    padded[0, : short.shape[1]] = short[0]
    padded[1] = long[0]
    lengths = torch.tensor([[short.shape[1]], [long.shape[1]]])
    with torch.no_grad():
        batched = model(padded, lengths)
        alone = model(short, torch.tensor([[short.shape[1]]]))
    assert batched.shape == (2, char_lstm.VOCAB_SIZE)
    torch.testing.assert_close(batched[0], alone[0], rtol=1e-5, atol=1e-6)


def test_digits_cnn_scales_raw_pixels_and_returns_logits_and_probabilities() -> None:
    torch.manual_seed(0)
    model = digits_cnn.DigitsCNN().eval()
    images = torch.rand(3, 1, 8, 8) * digits_cnn.PIXEL_MAX
    with torch.no_grad():
        logits, probabilities = model(images)
    assert logits.shape == probabilities.shape == (3, digits_cnn.NUM_CLASSES)
    torch.testing.assert_close(probabilities.sum(dim=1), torch.ones(3))
    assert torch.equal(logits.argmax(1), probabilities.argmax(1))


def test_digits_split_is_stratified_and_disjoint() -> None:
    split = digits_cnn.load_digits_split()
    assert split.train_x.shape[1:] == (1, 8, 8)
    assert len(split.train_y) + len(split.test_y) == 1797
    assert set(np.unique(split.test_y)) == set(range(10))
    assert split.train_x.max() <= digits_cnn.PIXEL_MAX


def test_from_onnx_reads_back_the_weights_of_an_exported_digits_cnn(tmp_path: Path) -> None:
    """BatchNorm is folded into the convolutions on export; the read-back model still agrees."""
    from batchserve.export.onnx import export_onnx
    from batchserve.export.spec import ExportSpec, parse_input_spec

    torch.manual_seed(3)
    trained = digits_cnn.DigitsCNN()
    for norm in (m for m in trained.modules() if isinstance(m, torch.nn.BatchNorm2d)):
        norm.running_mean.uniform_(-0.5, 0.5)
        norm.running_var.uniform_(0.5, 2.0)
    spec = ExportSpec("digits", (parse_input_spec("image:FP32:batch,1,8,8:0..16"),))
    (published,) = export_onnx(trained, spec, tmp_path).models

    read_back = digits_cnn.from_onnx(published.model_file)

    images = torch.rand(5, 1, 8, 8) * digits_cnn.PIXEL_MAX
    with torch.no_grad():
        for got, expected in zip(read_back(images), trained.eval()(images), strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not read_back.training


def test_as_bytes_gives_hwc_greyscale_that_scales_back_to_the_pixels() -> None:
    images = np.array([[[[0, 16], [8, 1]]]], dtype=np.float32)  # [1, 1, 2, 2]
    raw = digits_cnn.as_bytes(images)
    assert raw.dtype == np.uint8
    assert raw.shape == (1, 2, 2, 1)
    assert raw[..., 0].tolist() == [[[0, 255], [128, 16]]]
    back = raw.transpose(0, 3, 1, 2) * (digits_cnn.PIXEL_MAX / 255)
    np.testing.assert_allclose(back, images, atol=0.5 * digits_cnn.PIXEL_MAX / 255)


SHIPPED_CHAR_LSTM = Path(__file__).parents[3] / "model_repo" / "char_lstm" / "1" / "model.onnx"
PROGRAM = 'def main(argv):\n    """Greet."""\n    return print("hello", argv[1:]) or 0\n'


def _char_lstm_on_prefixes(text_ids: np.ndarray) -> np.ndarray:
    """The shipped char_lstm's logits after each prefix of ``text_ids``, one batch."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(SHIPPED_CHAR_LSTM), providers=["CPUExecutionProvider"])
    count = len(text_ids)
    tokens = np.zeros((count, count), np.int64)
    for row in range(count):
        tokens[row, : row + 1] = text_ids[: row + 1]
    lengths = np.arange(1, count + 1, dtype=np.int64)[:, None]
    (logits,) = session.run(None, {"tokens": tokens, "lengths": lengths})
    return np.asarray(logits)


def test_from_onnx_reads_back_the_shipped_char_lstm() -> None:
    ids = char_lstm.encode(PROGRAM)
    expected = _char_lstm_on_prefixes(ids)[-1]
    with torch.no_grad():
        got = char_lstm.from_onnx(SHIPPED_CHAR_LSTM)(
            torch.from_numpy(ids[None, :]), torch.tensor([[len(ids)]])
        )
    np.testing.assert_allclose(got.numpy()[0], expected, atol=1e-4)


def test_the_exported_step_fed_a_text_gives_char_lstm_s_logits_on_every_prefix(
    tmp_path: Path,
) -> None:
    """Two texts in one batch, one character per call, the state carried between calls:
    after each character, what char_lstm gives for that prefix (within 1e-4)."""
    import onnxruntime as ort
    from batchserve.export.onnx import export_onnx
    from batchserve.export.spec import ExportSpec, parse_input_spec

    step = char_lstm.CharLSTMStep(char_lstm.from_onnx(SHIPPED_CHAR_LSTM))
    inputs = (f"token:INT64:batch,1:0..{char_lstm.VOCAB_SIZE - 1}",
              "h_in:FP32:batch,2,128", "c_in:FP32:batch,2,128")  # fmt: skip
    spec = ExportSpec("char_lstm_step", tuple(parse_input_spec(s) for s in inputs),
                      outputs=("next_char_logits", "h_out", "c_out"))  # fmt: skip
    (published,) = export_onnx(step, spec, tmp_path).models
    session = ort.InferenceSession(str(published.model_file), providers=["CPUExecutionProvider"])

    texts = [char_lstm.encode(PROGRAM), char_lstm.encode(PROGRAM.upper()[::-1])]
    expected = [_char_lstm_on_prefixes(ids) for ids in texts]
    h = np.zeros((2, 2, 128), np.float32)
    c = np.zeros((2, 2, 128), np.float32)
    for position in range(len(PROGRAM)):
        token = np.array([[ids[position]] for ids in texts], np.int64)
        logits, h, c = session.run(None, {"token": token, "h_in": h, "c_in": c})
        for row, prefixes in enumerate(expected):
            np.testing.assert_allclose(logits[row], prefixes[position], atol=1e-4)
