"""Recurrent models over padded token ids plus true lengths; dynamic batch and sequence axes."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from batchserve.models.model_config import load_pbtxt
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

VOCAB = 50
CLASSES = 5
SPECS = (
    "--input",
    f"tokens:INT64:batch,seq:0..{VOCAB - 1}",
    "--input",
    "lengths:INT64:batch,1:1..seq",
)
SIZES = ("--batch-sizes", "1,2,5", "--axis-sizes", "seq=1,6,19")


class BiLSTMTagger(nn.Module):
    """Per-token tags from a stacked bidirectional LSTM that never reads past each length."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 12)
        self.lstm = nn.LSTM(12, 10, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(20, CLASSES)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(
            self.embed(tokens), lengths.squeeze(1), batch_first=True, enforce_sorted=False
        )
        hidden, _ = self.lstm(packed)
        padded, _ = pad_packed_sequence(hidden, batch_first=True, total_length=tokens.shape[1])
        return self.head(padded)


class GRUClassifier(nn.Module):
    """One label per sequence: the GRU state at each sample's last real token (length mask)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.embed = nn.Embedding(VOCAB, 12)
        self.gru = nn.GRU(12, 16, num_layers=2, batch_first=True)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        states, _ = self.gru(self.embed(tokens))
        last = (lengths - 1).unsqueeze(2).expand(-1, 1, states.shape[2])
        return self.head(states.gather(1, last).squeeze(1))


def _inputs(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 100 + seq)
    lengths = rng.integers(1, seq + 1, size=(batch, 1))
    lengths[0, 0] = seq
    return {"tokens": rng.integers(0, VOCAB, size=(batch, seq)), "lengths": lengths}


@pytest.mark.parametrize(
    ("factory", "output_dims"),
    [("BiLSTMTagger", [-1, CLASSES]), ("GRUClassifier", [CLASSES])],
)
def test_rnn_exports_and_validates_over_batch_and_sequence_sizes(
    export_cli: Callable[..., Any], repo: Path, factory: str, output_dims: list[int]
) -> None:
    result = export_cli(
        f"{__name__}:{factory}",
        *("--name", "rnn", *SPECS, *SIZES, "--sequence-length-input", "lengths"),
        *("--dynamic-batching", "--preferred-batch-size", "4", "--max-batch-size", "8"),
    )

    assert result.code == 0, result.err
    case_lines = [line for line in result.out.splitlines() if line.startswith("  batch=")]
    assert len(case_lines) == 9
    assert all(line.endswith("[ok]") for line in case_lines)
    assert "  batch=5 seq=19: output0" in result.out
    config = load_pbtxt(repo / "rnn" / "config.pbtxt")
    assert [(t.name, list(t.dims)) for t in config.input] == [("tokens", [-1]), ("lengths", [1])]
    assert list(config.output[0].dims) == output_dims
    assert config.batchserve.sequence_length_input == "lengths"
    assert list(config.dynamic_batching.preferred_batch_size) == [4]

    # Independently of the exporter's own check: a size it never tried, with ragged lengths.
    session = ort.InferenceSession(
        str(repo / "rnn" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    module = {"BiLSTMTagger": BiLSTMTagger, "GRUClassifier": GRUClassifier}[factory]().eval()
    inputs = _inputs(batch=4, seq=11)
    with torch.no_grad():
        expected = module(*(torch.from_numpy(inputs[k]) for k in ("tokens", "lengths"))).numpy()
    (got,) = session.run(None, inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)
