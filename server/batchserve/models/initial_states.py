"""The initial states of a sequence model's implicit states (``sequence_batching { state [
{ initial_state [...] } ] }``), checked and read as Triton does (``sequence_batch_scheduler``
``GenerateInitialStateData``).

An initial state has fixed ``dims`` (one per state dimension, equal where the state's is
fixed), the state's data type and a name, and its data is ``zero_data`` or the
``data_file`` in the model's ``initial_state/`` folder. A state without one starts as
zeros of the state's dims, a variable dimension 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import numpy as np

from batchserve.core.datatypes import from_config
from batchserve.models.data_files import inside_folder, tensor_from_file
from batchserve.proto.model_config_pb2 import ModelConfig, ModelSequenceBatching

INITIAL_STATE_DIR: Final = "initial_state"


def initial_state_problems(config: ModelConfig) -> list[str]:
    """Triton's checks of each ``initial_state``, in its words."""
    return [
        problem
        for state in config.sequence_batching.state
        for initial in state.initial_state[:1]
        for problem in _problems(state, initial)
    ]


def _problems(
    state: ModelSequenceBatching.State, initial: ModelSequenceBatching.InitialState
) -> list[str]:
    name = state.input_name
    problems: list[str] = []
    if initial.data_type != state.data_type:
        problems.append(
            f"The data type used for 'initial_state' field of state '{name}' does not match "
            "the state data type."
        )
    if not initial.name:
        problems.append(
            f"Field 'name' must be set when using initial_state for state input '{name}'."
        )
    problems += _dims_problems(name, list(initial.dims), list(state.dims))
    if initial.WhichOneof("state_data") is None:
        problems.append(f"initial_state setting expects state'{name}' to have state_data set")
    if initial.data_file and not inside_folder(initial.data_file):
        problems.append(
            f"state '{name}': initial_state data_file '{initial.data_file}' must be a path "
            f"inside {INITIAL_STATE_DIR}/"
        )
    return problems


def _dims_problems(name: str, dims: list[int], state_dims: list[int]) -> list[str]:
    if len(dims) != len(state_dims):
        return [
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
            f"dimensions for state input '{name}'. {len(dims)} != {len(state_dims)}"
        ]
    for dim, state_dim in zip(dims, state_dims, strict=True):
        if dim == -1:
            return [
                f"'initial_state' field for state input name '{name}' contains variable dimensions."
            ]
        if state_dim not in (-1, dim):
            return [
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim "
                f"description. {dim} != {state_dim}"
            ]
    return []


def read_initial_states(
    config: ModelConfig, model_dir: Path, *, source: str
) -> dict[str, np.ndarray]:
    """The states whose initial state is a data file, by state input name, read from the
    model's ``initial_state/`` folder; ModelConfigError naming the state and file."""
    states: dict[str, np.ndarray] = {}
    for state in config.sequence_batching.state:
        for initial in state.initial_state[:1]:
            if initial.WhichOneof("state_data") != "data_file":
                continue
            states[state.input_name] = tensor_from_file(
                f"{source}: state '{state.input_name}' initial_state '{initial.name}'",
                state.input_name, initial.data_file, from_config(initial.data_type),
                tuple(int(d) for d in initial.dims), model_dir,
                folder=INITIAL_STATE_DIR, setting="initial_state", field="data_file",
                file_kind="an initial state data file",
            )  # fmt: skip
    return states
