"""Configs of the built-in decoupled backends: what each requires, said at load."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
from batchserve.core.errors import ModelConfigError
from batchserve.models.decoupled import build_responder, builtin_problems
from batchserve.models.ensemble_loading import composing_configs
from batchserve.models.model_config import parse_pbtxt
from batchserve.models.repository import ModelRepository
from batchserve.proto.model_config_pb2 import ModelConfig

REPO = Path(__file__).resolve().parents[2] / "model_repo"


def _shipped(name: str) -> ModelConfig:
    return parse_pbtxt((REPO / name / "config.pbtxt").read_text())


@pytest.mark.parametrize("name", ["repeat_int32", "square_int32", "char_lstm_generate"])
def test_the_shipped_decoupled_configs_are_clean(name: str) -> None:
    assert builtin_problems(_shipped(name)) == []


@pytest.mark.parametrize("name", ["repeat_int32", "square_int32"])
def test_repeat_and_square_load_without_decoupled_as_tritons_qa_serves_them(name: str) -> None:
    """L0_decoupled's NonDecoupledTest and L0_grpc_state_cleanup serve repeat so; a
    generation model answers any number of times and still needs it."""
    config = _shipped(name)
    config.model_transaction_policy.ClearField("decoupled")
    assert builtin_problems(config) == []
    generation = _shipped("char_lstm_generate")
    generation.model_transaction_policy.ClearField("decoupled")
    assert builtin_problems(generation) == [
        "backend 'generation' answers with any number of responses: set "
        "model_transaction_policy { decoupled: true }"
    ]


@pytest.mark.parametrize("decoupled", [True, False])
def test_a_square_model_is_an_ensemble_step_only_when_decoupled(decoupled: bool) -> None:
    """A decoupled square is a decoupled step (``ensemble_flow.py``); without
    ``decoupled: true`` no step could pass on its many replies, and the ensemble would
    have handed its requests to a batcher with no instances: refused."""
    square = _shipped("square_int32")
    square.model_transaction_policy.decoupled = decoupled
    ensemble = parse_pbtxt(
        'name: "e" platform: "ensemble" max_batch_size: 0 '
        'input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ] '
        'output [ { name: "R" data_type: TYPE_INT32 dims: [ 1 ] } ] '
        'ensemble_scheduling { step [ { model_name: "square_int32" model_version: -1 '
        'input_map { key: "IN" value: "N" } output_map { key: "OUT" value: "R" } } ] }'
    )

    async def loaded(name: str) -> None:
        return None

    served = lambda name, version: SimpleNamespace(config=square)  # noqa: E731
    if decoupled:
        found = asyncio.run(composing_configs(ensemble, loaded, served, lambda _: True))  # type: ignore[arg-type]
        assert found == {"square_int32": square}
        return
    with pytest.raises(ModelConfigError) as refused:
        asyncio.run(composing_configs(ensemble, loaded, served, lambda _: True))  # type: ignore[arg-type]
    assert "and is not decoupled: batchserve does not support it in an ensemble (yet)" in str(
        refused.value
    )


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda c: setattr(c, "max_batch_size", 8), "set max_batch_size: 0"),
        (lambda c: c.input.pop(), "needs input 'WAIT' (UINT32)"),
        (lambda c: setattr(c.output[0], "data_type", 11), "output 'OUT' is FP32"),
        (lambda c: c.input.add(name="EXTRA", data_type=8), "input 'EXTRA' is not one"),
    ],
)
def test_a_repeat_config_that_breaks_the_contract_is_refused(edit: object, problem: str) -> None:
    config = _shipped("repeat_int32")
    edit(config)  # type: ignore[operator]
    assert any(problem in p for p in builtin_problems(config)), builtin_problems(config)


def test_a_generation_config_needs_its_parameters() -> None:
    config = _shipped("char_lstm_generate")
    del config.parameters["step_model"]
    assert builtin_problems(config) == ["backend 'generation' needs parameter 'step_model'"]


def test_a_generation_model_is_checked_against_its_step_model(tmp_path: Path) -> None:
    config = _shipped("char_lstm_generate")
    step = ModelRepository(REPO).resolve("char_lstm_step").config
    directory = REPO / "char_lstm_generate"
    assert build_responder(config, directory, lambda name: None, step)  # type: ignore[arg-type,return-value]
    with pytest.raises(ModelConfigError, match="not in the repository"):
        build_responder(config, directory, lambda name: None, None)  # type: ignore[arg-type,return-value]
    wrong = ModelConfig()
    wrong.CopyFrom(step)
    wrong.output[0].dims[:] = [97]
    with pytest.raises(ModelConfigError, match=r"dims \[98\]"):
        build_responder(config, directory, lambda name: None, wrong)  # type: ignore[arg-type,return-value]
    (tmp_path / "vocabulary.json").write_text('{"a": 1}')
    with pytest.raises(ModelConfigError, match="a JSON list of strings"):
        build_responder(config, tmp_path, lambda name: None, step)  # type: ignore[arg-type,return-value]
    stateless = ModelRepository(REPO).resolve("char_lstm").config
    with pytest.raises(ModelConfigError, match="no sequence_batching"):
        build_responder(config, directory, lambda name: None, stateless)  # type: ignore[arg-type,return-value]
