"""Decoupled models served by a backend built into the server, with no model file.

A config names one in ``backend`` and sets ``model_transaction_policy { decoupled: true }``:
- ``generation``: text generation with step-level batching over a stateful step model
  (``scheduler/generation.py``); its parameters name the step model, its token input and
  logits output, and the JSON file of the step model's vocabulary in this model's directory;
- ``repeat`` and ``square``: the contracts of Triton's example decoupled backends, so that
  NVIDIA's decoupled client examples run (``scheduler/example_responders.py``). These two
  also load without ``decoupled: true``, as Triton loads them (its QA's ``L0_decoupled`` and
  ``L0_grpc_state_cleanup`` do): each call then gets one response, or Triton's error where
  the request gets another number of them (``DataPlane._answered_once``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from batchserve.core.datatypes import from_config
from batchserve.core.errors import ModelConfigError
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInput, ModelOutput
from batchserve.scheduler.example_responders import RepeatResponder, SquareResponder
from batchserve.scheduler.generation import (
    MAX_TOKENS,
    PROMPT,
    SEED,
    STREAM,
    TEMPERATURE,
    TEXT,
    GenerationLimits,
    GenerationLoop,
    StepModel,
    Vocabulary,
)
from batchserve.scheduler.responders import Responder
from batchserve.scheduler.sequences import SequenceBatcher

GENERATION, REPEAT, SQUARE = "generation", "repeat", "square"
BUILTIN_BACKENDS: Final = (GENERATION, REPEAT, SQUARE)

_GENERATION_TENSORS: Final = {  # name: (datatype, input or output, optional)
    PROMPT: ("BYTES", "input", False),
    MAX_TOKENS: ("INT32", "input", True),
    TEMPERATURE: ("FP32", "input", True),
    SEED: ("UINT64", "input", True),
    STREAM: ("BOOL", "input", True),
    TEXT: ("BYTES", "output", False),
}
_EXAMPLE_TENSORS: Final = {
    REPEAT: {"IN": ("INT32", "input", False), "DELAY": ("UINT32", "input", False),
             "WAIT": ("UINT32", "input", False), "OUT": ("INT32", "output", False),
             "IDX": ("UINT32", "output", False)},
    SQUARE: {"IN": ("INT32", "input", False), "OUT": ("INT32", "output", False)},
}  # fmt: skip
_GENERATION_PARAMETERS: Final = ("step_model", "token_input", "logits_output", "vocabulary")

StepLookup = Callable[[str], SequenceBatcher]
"""The loaded step model's sequence batcher, by name; raises when it is not served."""


def builtin_backend(config: ModelConfig) -> str | None:
    return config.backend if config.backend in BUILTIN_BACKENDS else None


def step_model(config: ModelConfig) -> str | None:
    """The model a ``generation`` model runs its steps on, which must be served for it to
    answer; None for any other model."""
    if config.backend != GENERATION:
        return None
    return config.parameters["step_model"].string_value or None


def builtin_problems(config: ModelConfig) -> list[str]:
    """What a config for a built-in decoupled backend gets wrong, visible in it alone."""
    backend = config.backend
    problems = []
    if backend == GENERATION and not config.model_transaction_policy.decoupled:
        problems.append(
            f"backend '{backend}' answers with any number of responses: set "
            "model_transaction_policy { decoupled: true }"
        )
    if config.max_batch_size != 0:
        problems.append(f"backend '{backend}' takes one request at a time: set max_batch_size: 0")
    if config.platform:
        problems.append(f"backend '{backend}' has no platform: remove platform '{config.platform}'")
    expected = _GENERATION_TENSORS if backend == GENERATION else _EXAMPLE_TENSORS[backend]
    problems += list(_tensor_problems(config, backend, expected))
    if backend == GENERATION:
        problems += [
            f"backend 'generation' needs parameter '{key}'"
            for key in _GENERATION_PARAMETERS
            if not config.parameters[key].string_value
        ]
    return problems


def _tensor_problems(
    config: ModelConfig, backend: str, expected: dict[str, tuple[str, str, bool]]
) -> Iterator[str]:
    written: dict[str, tuple[str, ModelInput | ModelOutput]] = {
        t.name: ("input", t) for t in config.input
    }
    written.update({t.name: ("output", t) for t in config.output})
    for name, (datatype, kind, optional) in expected.items():
        found = written.pop(name, None)
        if found is None:
            if not optional:
                yield f"backend '{backend}' needs {kind} '{name}' ({datatype})"
            continue
        written_kind, tensor = found
        wire = from_config(tensor.data_type).wire
        if written_kind != kind or wire != datatype:
            yield (
                f"{written_kind} '{name}' is {wire}: backend '{backend}' takes it as an "
                f"{kind} of {datatype}"
            )
    for name, (kind, _) in written.items():
        yield f"{kind} '{name}' is not one backend '{backend}' knows ({_names(expected)})"


def _names(expected: dict[str, tuple[str, str, bool]]) -> str:
    return ", ".join(f"'{name}'" for name in expected)


def build_responder(
    config: ModelConfig, directory: Path, step: StepLookup, step_config: ModelConfig | None
) -> Responder:
    """The responder of a loaded built-in decoupled model. ``step_config`` is the generation
    model's step model as the repository holds it, checked here against the parameters."""
    if config.backend == REPEAT:
        return RepeatResponder()
    if config.backend == SQUARE:
        return SquareResponder()
    parameters = {key: config.parameters[key].string_value for key in _GENERATION_PARAMETERS}
    name = parameters["step_model"]
    vocabulary = _vocabulary(directory, parameters["vocabulary"], config.name)
    if step_config is None:
        raise ModelConfigError(
            f"{config.name}: parameter 'step_model' names '{name}', which is not in the repository"
        )
    _check_step_model(config.name, step_config, parameters, len(vocabulary.symbols))
    return GenerationLoop(
        config.name,
        StepModel(name, lambda: step(name), parameters["token_input"], parameters["logits_output"]),
        vocabulary,
        GenerationLimits(),
    )


def _vocabulary(directory: Path, filename: str, model: str) -> Vocabulary:
    path = directory / filename
    if Path(filename).name != filename or not path.is_file():
        raise ModelConfigError(
            f"{model}: parameter 'vocabulary' names '{filename}', which is not a file in the "
            "model's directory"
        )
    try:
        symbols = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{model}/{filename}: not a JSON file ({exc})") from None
    if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
        raise ModelConfigError(
            f"{model}/{filename}: expected a JSON list of strings, one per token id"
        )
    return Vocabulary(tuple(symbols))


def _check_step_model(
    model: str, step: ModelConfig, parameters: dict[str, str], vocabulary: int
) -> None:
    name = parameters["step_model"]
    where = f"{model}: step model '{name}'"
    stateful = step.WhichOneof("scheduling_choice") == "sequence_batching"
    if not stateful or not step.sequence_batching.state:
        raise ModelConfigError(f"{where} has no sequence_batching with implicit state")
    inputs = {t.name: t for t in step.input}
    outputs = {t.name: t for t in step.output}
    token = inputs.get(parameters["token_input"])
    if token is None or from_config(token.data_type).wire != "INT64" or len(inputs) != 1:
        raise ModelConfigError(
            f"{where} must take one INT64 input '{parameters['token_input']}' besides its "
            "state and controls"
        )
    logits = outputs.get(parameters["logits_output"])
    if logits is None or list(logits.dims) != [vocabulary]:
        raise ModelConfigError(
            f"{where} must have an output '{parameters['logits_output']}' with dims "
            f"[{vocabulary}] (one logit per token of the vocabulary)"
        )
