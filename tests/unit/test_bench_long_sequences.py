"""bench.long_sequences: the requests it sends, the config it raises, and the file it writes."""

from __future__ import annotations

from pathlib import Path

from batchserve.models.model_config import load_pbtxt
from batchserve.zoo.char_lstm import PAD, VOCAB_SIZE

from bench.long_sequences import GROUPS, RAISED_STEPS, SHAPES, raised_copy, render, requests
from bench.memory_rounds import Round, taking_turns


def test_the_requests_are_seeded_valid_token_ids_of_the_mixed_shapes() -> None:
    sent = requests()
    assert len(sent) == GROUPS * len(SHAPES)
    assert [tokens.shape for tokens, _ in sent[: len(SHAPES)]] == list(SHAPES)
    for tokens, lengths in sent:
        assert tokens.min() >= 0
        assert tokens.max() < VOCAB_SIZE
        assert not (tokens == PAD).any()  # padding is the server's to add
        assert (lengths[:, 0] == tokens.shape[1]).all()
    again = requests()
    assert all((a == b).all() for (a, _), (b, _) in zip(sent, again, strict=True))


def test_the_raised_copy_sets_max_batch_steps_and_the_shipped_one_does_not(tmp_path: Path) -> None:
    (tmp_path / "raised").mkdir()
    (tmp_path / "shipped").mkdir()
    raised_copy(tmp_path / "raised", RAISED_STEPS)
    raised_copy(tmp_path / "shipped", 0)
    raised = load_pbtxt(tmp_path / "raised" / "char_lstm" / "config.pbtxt")
    shipped = load_pbtxt(tmp_path / "shipped" / "char_lstm" / "config.pbtxt")
    assert raised.batchserve.max_batch_steps == RAISED_STEPS
    assert shipped.batchserve.max_batch_steps == 0
    assert raised.batchserve.sequence_length_input == shipped.batchserve.sequence_length_input


def test_the_report_has_every_round_and_the_medians_of_each_setting() -> None:
    rounds = [
        Round("bounded", 9.0, 176.0, 182.0),
        Round("raised", 4.0, 176.0, 500.0),
        Round("raised", 5.0, 176.0, 476.0),
        Round("bounded", 10.0, 176.0, 186.0),
    ]
    text = render(rounds, 32)
    assert text.count("| bounded |") == 2
    assert "| 2 | raised | 4.00 | 176 | 500 |" in text
    assert "bounded 9.50 s and 8 MiB above the loaded model at the peak" in text
    assert "raised 4.50 s and 312 MiB; time bounded / raised 2.11." in text


def test_the_settings_take_turns_at_going_first() -> None:
    assert taking_turns(3) == ["bounded", "raised", "raised", "bounded", "bounded", "raised"]
