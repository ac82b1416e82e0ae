"""An ensemble's config checks, in Triton's words (its ``model_config_utils.cc`` and
``ensemble_utils.cc``), the reshape rule between batching and non-batching steps, and which
models an unload touches."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
from batchserve.core.datatypes import BY_WIRE
from batchserve.core.errors import ModelConfigError, NotFound
from batchserve.models.config_validation import config_problems
from batchserve.models.ensemble import Value, _fitted
from batchserve.models.ensemble_config import (
    composing_models,
    composing_problems,
    decoupled_labels,
    ensemble_steps,
    is_ensemble,
    needed_steps,
    structure_problems,
)
from batchserve.models.ensemble_loading import EnsembleDependencies, composing_configs
from batchserve.models.model_config import parse_pbtxt
from batchserve.proto.model_config_pb2 import ModelConfig

HEAD = """
name: "e"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version}{maps} }}'


def _ensemble(*steps: str, head: str = HEAD) -> ModelConfig:
    return parse_pbtxt(head + f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}")


def _model(name: str, inputs: str, outputs: str, max_batch_size: int = 8) -> ModelConfig:
    return parse_pbtxt(
        f'name: "{name}" backend: "onnxruntime" max_batch_size: {max_batch_size} '
        f"input [ {inputs} ] output [ {outputs} ]"
    )


def _tensor(name: str, dims: str = "4", data_type: str = "TYPE_FP32", extra: str = "") -> str:
    return f'{{ name: "{name}" data_type: {data_type} dims: [ {dims} ] {extra} }}'


TWO_STEPS = (
    _step("first", {"X": "IN"}, {"Y": "middle"}),
    _step("second", {"X": "middle"}, {"Y": "OUT"}),
)


def test_a_well_formed_pipeline_has_no_problem_and_its_steps_read_in_order() -> None:
    config = _ensemble(*TWO_STEPS)
    assert is_ensemble(config)
    assert structure_problems(config) == []
    steps = ensemble_steps(config)
    assert [(s.model, s.version, s.inputs, s.outputs) for s in steps] == [
        ("first", "", (("X", "IN"),), (("Y", "middle"),)),
        ("second", "", (("X", "middle"),), (("Y", "OUT"),)),
    ]
    assert composing_models(config) == ["first", "second"]


@pytest.mark.parametrize(
    ("steps", "head_extra", "problem"),
    [
        ((), "", "must specify 'step' for ensemble 'e'"),
        (
            (_step("", {"X": "IN"}, {"Y": "OUT"}),),
            "",
            "must specify 'model_name' in step 0 of ensemble 'e'",
        ),
        (
            (TWO_STEPS[0], _step("second", {}, {"Y": "OUT"})),
            "",
            "must specify 'input_map' in step 1 of ensemble 'e'",
        ),
        (
            (_step("first", {"X": "IN"}, {}),),
            "",
            "must specify 'output_map' in step 0 of ensemble 'e'",
        ),
        (
            (_step("first", {"X": "IN"}, {"Y": "OUT"}), _step("again", {"X": "IN"}, {"Y": "OUT"})),
            "",
            "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'e' step 1",
        ),
        (
            (_step("first", {"X": "elsewhere"}, {"Y": "OUT"}),),
            "",
            "ensemble input 'IN' for ensemble e' is not used",
        ),
        (
            (_step("first", {"X": "IN"}, {"Y": "other"}), _step("s", {"X": "other"}, {"Y": "z"})),
            "",
            "ensemble output 'OUT' for ensemble e' is not used",
        ),
        (
            (_step("first", {"X": "IN", "Z": "nowhere"}, {"Y": "OUT"}),),
            "",
            "output 'OUT' for ensemble 'e' is not written: at least one of its depending "
            "tensors, 'nowhere', is not connected",
        ),
        (  # a cycle: each step waits on the other
            (
                _step("first", {"X": "IN", "W": "back"}, {"Y": "middle"}),
                _step("second", {"X": "middle"}, {"Y": "back"}),
                _step("third", {"X": "middle"}, {"Y": "OUT"}),
            ),
            "",
            "output 'OUT' for ensemble 'e' is not written: at least one of its depending "
            "tensors, 'back', is not connected",  # Triton's walk: OUT, middle, back (seen)
        ),
        (
            (_step("first", {"X": "IN"}, {"Y": "OUT", "Z": "spare"}),),
            "",
            "ensemble tensor 'spare' is unused in ensemble 'e'",
        ),
        (
            TWO_STEPS,
            "instance_group [ { count: 1 } ]",
            "instance group should not be specified for ensemble 'e'",
        ),
        (
            TWO_STEPS,
            'model_warmup [ { name: "w" batch_size: 1 } ]',
            "model_warmup can not be specified for ensemble 'e'",
        ),
    ],
    ids=[
        "no steps",
        "no model",
        "no inputs",
        "no outputs",
        "written twice",
        "input unused",
        "output unused",
        "output unwritten",
        "cycle",
        "tensor unread",
        "instance group",
        "warm-up",
    ],
)
def test_a_malformed_ensemble_is_refused_in_tritons_words(
    steps: tuple[str, ...], head_extra: str, problem: str
) -> None:
    config = _ensemble(*steps, head=HEAD + head_extra)
    assert structure_problems(config) == [problem]


def test_the_ensemble_platform_without_scheduling_is_refused() -> None:
    config = parse_pbtxt(HEAD)
    assert is_ensemble(config)
    assert structure_problems(config) == [
        "ensemble scheduling must be set for ensemble e whose platform is ensemble"
    ]


def _composing(**overrides: ModelConfig) -> dict[str, ModelConfig]:
    models = {
        "first": _model("first", _tensor("X"), _tensor("Y")),
        "second": _model("second", _tensor("X"), _tensor("Y")),
    }
    models.update(overrides)
    return models


def test_steps_that_agree_with_their_models_pass() -> None:
    assert composing_problems(_ensemble(*TWO_STEPS), _composing()) == []


@pytest.mark.parametrize(
    ("second", "problem"),
    [
        (
            _model("second", _tensor("X"), _tensor("Y"), max_batch_size=4),
            "ensemble e allows maximum batch size 8, but it contains model second which only "
            "allows maximum batch size to be 4",
        ),
        (
            _model("second", _tensor("A"), _tensor("Y")),
            "in ensemble e, ensemble tensor middle is mapping to non-existing input X in model "
            "second",
        ),
        (
            _model("second", f"{_tensor('X')}, {_tensor('B')}", _tensor("Y")),
            "in ensemble e, input B in model second is not mapped to any ensemble tensors",
        ),
        (
            _model("second", _tensor("X"), _tensor("Z")),
            "in ensemble e, ensemble tensor OUT is mapped from non-existing output Y in model "
            "second",
        ),
        (
            _model("second", _tensor("X", data_type="TYPE_INT32"), _tensor("Y")),
            "in ensemble e, ensemble tensor middle: inconsistent data type: TYPE_FP32 is "
            "inferred from model first while TYPE_INT32 is inferred from model second",
        ),
        (
            _model("second", _tensor("X", dims="5"), _tensor("Y")),
            "in ensemble e, ensemble tensor middle: inconsistent shape: [-1,4] is inferred "
            "from model first while [-1,5] is inferred from model second",
        ),
    ],
    ids=["batch cap", "no such input", "input unmapped", "no such output", "type", "shape"],
)
def test_steps_that_disagree_with_their_models_are_refused_in_tritons_words(
    second: ModelConfig, problem: str
) -> None:
    assert composing_problems(_ensemble(*TWO_STEPS), _composing(second=second)) == [problem]


def test_an_optional_input_may_be_left_unmapped_and_free_dims_agree() -> None:
    second = _model(
        "second", f"{_tensor('X', dims='-1')}, {_tensor('B', extra='optional: true')}", _tensor("Y")
    )
    assert composing_problems(_ensemble(*TWO_STEPS), _composing(second=second)) == []


def test_a_non_batching_step_may_take_the_whole_batch_as_its_shape() -> None:
    """Triton's batch_to_nobatch ensembles: [-1, -1] of a model that does not batch agrees
    with the batched [-1, 4] (the full shapes are compared when the own shapes differ)."""
    second = _model("second", _tensor("X", dims="-1, -1"), _tensor("Y", dims="-1, -1"), 0)
    assert composing_problems(_ensemble(*TWO_STEPS), _composing(second=second)) == []
    second = _model("second", _tensor("X", dims="-1, -1"), _tensor("Y", dims="2"), 0)
    assert composing_problems(_ensemble(*TWO_STEPS), _composing(second=second)) == [
        "in ensemble e, ensemble tensor OUT: inconsistent shape: [-1,4] is inferred from model "
        "e while [2] is inferred from model second"
    ]


FP32 = BY_WIRE["FP32"]


@pytest.mark.parametrize(
    ("shape", "batch", "dims", "batching", "fitted"),
    [
        ((2, 4), 2, (4,), True, (2, 4)),  # batched to batching: as it is
        ((4,), 0, (4,), True, (1, 4)),  # unbatched, the input's own shape: a batch of 1
        ((3, 4), 0, (4,), True, (3, 4)),  # unbatched in another shape: taken as a batch
        ((1, 4), 1, (4,), False, (4,)),  # a batch of 1 to a model that does not batch
        ((2, 4), 2, (-1, -1), False, (2, 4)),  # the whole batch is the input's own shape
        ((1, 4), 1, (-1, -1), False, (1, 4)),  # so is a batch of 1 there
    ],
)
def test_tensors_between_batching_and_non_batching_steps_follow_tritons_rule(
    shape: tuple[int, ...],
    batch: int,
    dims: tuple[int, ...],
    batching: bool,
    fitted: tuple[int, ...],
) -> None:
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    out = _fitted(Value(FP32, data, batch), dims, batching)
    assert out.shape == fitted
    assert np.shares_memory(out, data)  # a view: no copy between steps


def test_an_unload_touches_the_models_an_ensemble_alone_kept_loaded() -> None:
    graph = EnsembleDependencies()
    graph.loaded_along("first")
    graph.loaded_along("second")
    graph.loaded_along("shared")
    graph.ensemble_loaded("e", ["first", "second", "shared"])
    graph.ensemble_loaded("f", ["shared", "asked"])
    graph.asked_for("second")  # loaded by name since: the user's now
    assert graph.users_of("shared") == ["e", "f"]
    assert graph.users_of("nobody") == []
    assert graph.unloaded("e") == ["first"]  # shared still used by f; second asked for
    assert graph.unloaded("f") == ["shared"]  # asked was never loaded along
    assert graph.users_of("shared") == []


def test_only_the_steps_writing_what_is_asked_for_run() -> None:
    """Triton's pruning: a step runs when one of its outputs is asked for, or read by a step
    that runs."""
    config = _ensemble(
        _step("first", {"X": "IN"}, {"Y": "middle"}),
        _step("second", {"X": "middle"}, {"Y": "OUT"}),
        _step("side", {"X": "IN"}, {"Y": "OTHER", "Z": "spare"}),
        _step("after_side", {"X": "spare"}, {"Y": "LAST"}),
    )
    steps = ensemble_steps(config)
    assert [s.model for s in needed_steps(steps, ["OUT"])] == ["first", "second"]
    assert [s.model for s in needed_steps(steps, ["OTHER"])] == ["side"]
    assert [s.model for s in needed_steps(steps, ["LAST"])] == ["side", "after_side"]
    assert needed_steps(steps, ["OUT", "OTHER", "LAST"]) == steps
    assert needed_steps(steps, []) == ()


def _decoupled(name: str) -> ModelConfig:
    model = _model(name, _tensor("X"), _tensor("Y"))
    model.model_transaction_policy.decoupled = True
    return model


def test_each_decoupled_step_gives_what_follows_it_a_label_of_its_own() -> None:
    """Triton's decoupled workflow labels: the ensemble's inputs 0, each decoupled step's
    outputs a new one, inherited by what is made from them alone."""
    config = _ensemble(*TWO_STEPS)
    labels, problems = decoupled_labels(config, _composing(first=_decoupled("first")))
    assert problems == []
    assert labels == {"IN": 0, "middle": 1, "OUT": 1}
    labels, _ = decoupled_labels(config, _composing())
    assert labels == {"IN": 0, "middle": 0, "OUT": 0}


def test_a_step_reading_two_decoupled_origins_is_refused_in_tritons_words() -> None:
    """A step reading the ensemble's input and a decoupled step's output could pair no
    response of the one with the other: Triton refuses the ensemble, and so its outputs
    written from two origins."""
    mixing = _ensemble(
        _step("first", {"X": "IN"}, {"Y": "middle"}),
        _step("second", {"X": "middle", "Z": "IN"}, {"Y": "OUT"}),
    )
    composing = _composing(first=_decoupled("first"))
    assert decoupled_labels(mixing, composing)[1] == [
        "in ensemble e, step of model 'second' receives inputs originated from different "
        "decoupled models"
    ]
    two_outputs = _ensemble(
        _step("first", {"X": "IN"}, {"Y": "OUT"}),
        _step("second", {"X": "IN"}, {"Y": "OTHER"}),
        head=HEAD.replace("output [ ", 'output [ { name: "OTHER" data_type: TYPE_FP32 '
                          "dims: [ 4 ] }, "),
    )  # fmt: skip
    assert decoupled_labels(two_outputs, composing)[1] == [
        "in ensemble e, step of model 'e' receives inputs originated from different "
        "decoupled models"
    ]


def test_an_ensemble_that_names_a_backend_is_refused_in_tritons_words() -> None:
    """Triton's ``ValidateModelConfig`` (L0_model_config ``has_backend``)."""
    config = _ensemble(
        _step("first", {"X": "IN"}, {"Y": "OUT"}), head=HEAD + 'backend: "onnxruntime"'
    )
    assert config_problems(config, source="e/config.pbtxt", directory="e") == [
        "e/config.pbtxt: Ensemble model 'e' must have platform type 'ensemble' and empty "
        "backend type (batchserve: it names backend 'onnxruntime')"
    ]


def _load_ensembles(
    name: str, ensembles: dict[str, ModelConfig], available: set[str]
) -> tuple[list[str], str]:
    """Load the ensemble ``name`` as the registry does, an ensemble step by loading that
    ensemble in turn: the models loaded, and the error the load ended with."""
    loaded: list[str] = []

    async def load(model: str) -> None:
        if model in ensembles:
            await composing_configs(ensembles[model], load, served, available.__contains__)
        loaded.append(model)

    def served(model: str, version: str) -> SimpleNamespace:
        if model not in loaded:
            raise NotFound(f"model '{model}' is not loaded")
        return SimpleNamespace(config=_model(model, _tensor("X"), _tensor("Y")))

    try:
        asyncio.run(composing_configs(ensembles[name], load, served, available.__contains__))
    except ModelConfigError as exc:
        return loaded, exc.message
    return loaded, ""


def test_models_not_in_the_repository_are_listed_before_an_ensemble_loads_any() -> None:
    """Triton's dependency graph (L0_model_config ``non_existing_model``): every step's
    model that is neither loaded nor in the repository once, sorted, and nothing loaded."""
    ensemble = _ensemble(
        _step("first", {"X": "IN"}, {"Y": "A"}),
        _step("zeta", {"X": "A"}, {"Y": "B"}),
        _step("gamma", {"X": "B"}, {"Y": "OUT"}),
    )
    loaded, error = _load_ensembles("e", {"e": ensemble}, {"first"})
    assert error == "ensemble e contains models that are not available or ambiguous: gamma, zeta"
    assert loaded == []
    loaded, error = _load_ensembles("e", {"e": ensemble}, {"first", "gamma", "zeta"})
    assert (loaded, error) == (["first", "zeta", "gamma"], "")


def test_ensembles_that_lead_back_to_themselves_are_refused_in_tritons_words() -> None:
    """Triton's ``CircularDependencyCheck`` (L0_model_config ``self_circular_dependency``
    and ``circular_dependency``): the circle from the ensemble it starts at back to it."""
    itself = _ensemble(_step("e", {"IN": "IN"}, {"OUT": "OUT"}))
    _, error = _load_ensembles("e", {"e": itself}, {"e"})
    assert error == (
        "circular dependency between ensembles: e -> ... -> e -> e (batchserve: e -> e)"
    )
    a = _ensemble(_step("b", {"IN": "IN"}, {"OUT": "OUT"}), head=HEAD.replace('"e"', '"a"'))
    b = _ensemble(_step("a", {"IN": "IN"}, {"OUT": "OUT"}), head=HEAD.replace('"e"', '"b"'))
    loaded, error = _load_ensembles("a", {"a": a, "b": b}, {"a", "b"})
    assert error == (
        "circular dependency between ensembles: a -> ... -> b -> a (batchserve: a -> b -> a)"
    )
    assert loaded == []
