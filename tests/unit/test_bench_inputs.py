"""The bench's request sample: the realistic values this repository knows for its models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from batchserve.proto.model_config_pb2 import ModelConfig
from google.protobuf import text_format

from bench.inputs import plan

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_lstm_gets_its_realistic_tokens_and_true_length(tmp_path: Path) -> None:
    shipped = text_format.Parse(
        (ROOT / "model_repo" / "char_lstm" / "config.pbtxt").read_text(), ModelConfig()
    )
    inputs = plan("char_lstm", shipped, {})
    tokens, lengths = (s.array for s in inputs.samples)
    assert tokens.tolist() == list(range(3, 35))
    assert tokens.dtype == np.int64
    assert lengths.tolist() == [32]
    feeds = inputs.feeds(4)
    assert feeds["tokens"].shape == (4, 32)
    assert feeds["lengths"].shape == (4, 1)
    assert inputs.notes == (
        "char_lstm: free axes of 'tokens' set to 32 (--shape NAME:DIMS sets them)",
    )
    args = inputs.pa_args(tmp_path)
    assert args[2:] == ["--shape", "tokens:32"]
    data = json.loads(Path(args[1]).read_text())["data"][0]
    assert data["lengths"] == {"content": [32], "shape": [1]}
