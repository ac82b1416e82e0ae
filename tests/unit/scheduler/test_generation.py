"""Step-level generation over the shipped char_lstm_step, run by a real sequence batcher:
generations join and leave between steps, each gets what it gets alone, and one whose
client left is dropped at the next step. Plus the sampling and vocabulary rules."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.core.device import CPU
from batchserve.core.errors import InvalidArgument, NotFound, Overloaded
from batchserve.models.model_config import parse_pbtxt
from batchserve.observability.stats import ModelStats
from batchserve.scheduler.generation import (
    GenerationLoop,
    StepModel,
    Vocabulary,
    sample,
)
from batchserve.scheduler.instances import Instance, InstancePool
from batchserve.scheduler.policy import BatchPolicy
from batchserve.scheduler.sequences import SequenceBatcher, SequencePolicy

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[3] / "model_repo"
VOCABULARY = Vocabulary(
    tuple(json.loads((REPO / "char_lstm_generate/vocabulary.json").read_text()))
)


def _step_batcher(max_live: int = 64) -> SequenceBatcher:
    config = parse_pbtxt((REPO / "char_lstm_step/config.pbtxt").read_text())
    backend = OnnxBackend()
    backend.load(REPO / "char_lstm_step/1/model.onnx", config, CPU)
    sequences = SequencePolicy.from_config(config)
    assert sequences is not None
    return SequenceBatcher(
        "char_lstm_step", InstancePool([Instance("step-0", backend)]),
        BatchPolicy.from_config(config, server_max_queue_size=64), ModelStats(), sequences,
        max_live=max_live,
    )  # fmt: skip


def _loop(batcher: SequenceBatcher) -> GenerationLoop:
    step = StepModel("char_lstm_step", lambda: batcher, "token", "next_char_logits")
    return GenerationLoop("gen", step, VOCABULARY)


def _inputs(prompt: str, tokens: int, temperature: float = 0.0, seed: int = 0) -> dict:
    return {
        "text_input": np.array([prompt.encode()], dtype=np.object_),
        "max_tokens": np.array([tokens], dtype=np.int32),
        "temperature": np.array([temperature], dtype=np.float32),
        "random_seed": np.array([seed], dtype=np.uint64),
    }


async def _text(loop: GenerationLoop, inputs: dict, streaming: bool = True) -> list[str]:
    pieces = []
    async for reply in loop.replies(inputs, None, streaming):
        pieces.append(reply.outputs["text_output"][0].decode())
        finals = reply.final
    assert finals  # the last reply is marked final
    return pieces


async def test_generations_that_join_and_leave_get_what_they_get_alone() -> None:
    batcher = _step_batcher()
    loop = _loop(batcher)
    requests = [_inputs("import ", 3, 0.9, 1), _inputs("def f(x", 12, 0.9, 2),
                _inputs("x", 6, 0.0)]  # fmt: skip
    alone = [await _text(loop, r) for r in requests]
    assert [len(a) for a in alone] == [3, 12, 6]
    steps_alone, rows_alone = loop.steps, loop.rows
    assert rows_alone == sum(len(p) + n - 1 for p, n in (("import ", 3), ("def f(x", 12), ("x", 6)))

    first = asyncio.ensure_future(_text(loop, requests[0]))
    second = asyncio.ensure_future(_text(loop, requests[1]))
    assert await first == alone[0]
    late = asyncio.ensure_future(_text(loop, requests[2]))  # joins while the second runs
    assert await second == alone[1]
    assert await late == alone[2]
    assert loop.rows - rows_alone == rows_alone  # the same rows ...
    assert loop.steps - steps_alone < steps_alone  # ... in fewer, shared steps
    assert loop.active == 0


async def test_not_streaming_answers_once_with_the_whole_text() -> None:
    loop = _loop(_step_batcher())
    pieces = await _text(loop, _inputs("class ", 9, 0.5, 4))
    (whole,) = await _text(loop, _inputs("class ", 9, 0.5, 4), streaming=False)
    assert whole == "".join(pieces)
    inputs = {**_inputs("class ", 9, 0.5, 4), "stream": np.array([True])}  # the input decides
    assert await _text(loop, inputs, streaming=False) == pieces


async def test_a_generation_whose_client_left_is_dropped_at_the_next_step() -> None:
    loop = _loop(_step_batcher())
    replies = loop.replies(_inputs("x", 500, 1.0), None, True)
    await anext(replies)
    await replies.aclose()  # the client leaves after one character
    await asyncio.sleep(0.2)
    assert loop.active == 0
    assert loop.rows < 10


async def test_generations_count_against_the_step_model_s_live_sequences() -> None:
    loop = _loop(_step_batcher(max_live=2))
    running = [loop.replies(_inputs("a", 50), None, True) for _ in range(2)]
    for replies in running:
        await anext(replies)
    with pytest.raises(Overloaded, match="runs 2 generations"):
        await anext(loop.replies(_inputs("a", 5), None, True))
    for replies in running:
        await replies.aclose()


async def test_a_step_model_that_is_gone_fails_the_generation_clearly() -> None:
    batcher = _step_batcher()
    calls = [0]

    def lookup() -> SequenceBatcher:
        calls[0] += 1
        if calls[0] > 2:  # unloaded after a step
            raise NotFound("Request for unknown model: 'char_lstm_step' is not found")
        return batcher

    loop = GenerationLoop("gen", StepModel("char_lstm_step", lookup, "token", "next_char_logits"),
                          VOCABULARY)  # fmt: skip
    with pytest.raises(NotFound, match="char_lstm_step"):
        await _text(loop, _inputs("ab", 5))
    assert loop.active == 0


@pytest.mark.parametrize(
    ("inputs", "problem"),
    [
        (_inputs("", 5), "the prompt is empty"),
        (_inputs("a", 0), "0 is outside 1..1024"),
        (_inputs("a", 5, float("nan")), "is not a number >= 0"),
        ({"text_input": np.array([b"\xff"], dtype=np.object_)}, "not valid UTF-8"),
    ],
)
async def test_bad_requests_are_refused_before_any_step(inputs: dict, problem: str) -> None:
    loop = _loop(_step_batcher())
    with pytest.raises(InvalidArgument, match=problem):
        await anext(loop.replies(inputs, None, True))
    assert loop.steps == 0


def test_the_vocabulary_maps_unknown_characters_to_the_replacement_token() -> None:
    assert VOCABULARY.encode("a\n") == [ord("a") - 32 + 3, 2]
    assert VOCABULARY.encode("é") == [1]  # U+FFFD's token
    strict = Vocabulary(("", "a", "b"))
    with pytest.raises(InvalidArgument, match="'c' is not in the model's vocabulary"):
        strict.encode("abc")


def test_sampling_is_greedy_at_zero_reproducible_by_seed_and_never_picks_padding() -> None:
    logits = np.array([50.0, 1.0, 2.0, 1.5], dtype=np.float32)
    allowed = np.array([False, True, True, True])
    assert sample(logits, 0.0, np.random.default_rng(0), allowed) == 2
    draws = [sample(logits, 1.0, np.random.default_rng(seed), allowed) for seed in range(400)]
    assert 0 not in draws
    assert draws == [sample(logits, 1.0, np.random.default_rng(s), allowed) for s in range(400)]
    counts = np.bincount(draws, minlength=4)[1:] / len(draws)
    expected = np.exp([1.0, 2.0, 1.5]) / np.exp([1.0, 2.0, 1.5]).sum()
    np.testing.assert_allclose(counts, expected, atol=0.07)
