"""Initial states of implicit states, checked and read as Triton does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from batchserve.core.errors import ModelConfigError
from batchserve.models.initial_states import initial_state_problems, read_initial_states
from batchserve.models.model_config import parse_pbtxt
from batchserve.scheduler.sequences import SequencePolicy


def _config(initial: str, state_dims: str = "[2]") -> str:
    return f"""name: "m" max_batch_size: 4
    sequence_batching {{ state [{{ input_name: "S_IN" output_name: "S_OUT"
      data_type: TYPE_INT32 dims: {state_dims} initial_state [{{ {initial} }}] }}] }}"""


@pytest.mark.parametrize(
    ("initial", "state_dims", "words"),
    [
        ('data_type: TYPE_FP32 dims: [2] zero_data: true name: "i"', "[2]",
         "The data type used for 'initial_state' field of state 'S_IN' does not match the "
         "state data type."),
        ("data_type: TYPE_INT32 dims: [2] zero_data: true", "[2]",
         "Field 'name' must be set when using initial_state for state input 'S_IN'."),
        ('data_type: TYPE_INT32 dims: [2, 1] zero_data: true name: "i"', "[2]",
         "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions "
         "for state input 'S_IN'. 2 != 1"),
        ('data_type: TYPE_INT32 dims: [-1] zero_data: true name: "i"', "[-1]",
         "'initial_state' field for state input name 'S_IN' contains variable dimensions."),
        ('data_type: TYPE_INT32 dims: [3] zero_data: true name: "i"', "[2]",
         "'initial_state' dim for input name 'S_IN' doesn't match 'state' dim description. "
         "3 != 2"),
        ('data_type: TYPE_INT32 dims: [2] name: "i"', "[2]",
         "initial_state setting expects state'S_IN' to have state_data set"),
        ('data_type: TYPE_INT32 dims: [2] data_file: "../x" name: "i"', "[2]",
         "initial_state data_file '../x' must be a path inside initial_state/"),
    ],
)  # fmt: skip
def test_tritons_checks_in_its_words(initial: str, state_dims: str, words: str) -> None:
    problems = initial_state_problems(parse_pbtxt(_config(initial, state_dims)))
    assert any(words in problem for problem in problems), problems


def test_a_data_file_is_the_state_at_start_and_zero_data_its_own_dims(tmp_path: Path) -> None:
    """L0_sequence_batcher's INITIAL_STATE_FILE: the state starts from the file's values;
    a state of variable dims starts at its initial_state's dims."""
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "start").write_bytes(np.array([100, 7], np.int32).tobytes())
    config = parse_pbtxt(_config('data_type: TYPE_INT32 dims: [2] data_file: "start" name: "i"'))
    assert initial_state_problems(config) == []
    read = read_initial_states(config, tmp_path, source="m/config.pbtxt")
    policy = SequencePolicy.from_config(config, read)
    assert policy is not None
    assert policy.states[0].initial.tolist() == [100, 7]
    zero = parse_pbtxt(_config('data_type: TYPE_INT32 dims: [3] zero_data: true name: "z"', "[-1]"))
    zero_policy = SequencePolicy.from_config(zero, read_initial_states(zero, tmp_path, source="m"))
    assert zero_policy is not None
    assert zero_policy.states[0].initial.tolist() == [0, 0, 0]


def test_a_short_or_missing_file_fails_the_load_naming_it(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "short").write_bytes(b"\x01\x00\x00\x00")
    short = parse_pbtxt(_config('data_type: TYPE_INT32 dims: [2] data_file: "short" name: "i"'))
    with pytest.raises(ModelConfigError, match="initial_state setting expects 8 bytes, but the "
                       "data provided from short only has 4 bytes"):  # fmt: skip
        read_initial_states(short, tmp_path, source="m/config.pbtxt")
    missing = parse_pbtxt(_config('data_type: TYPE_INT32 dims: [2] data_file: "none" name: "i"'))
    with pytest.raises(ModelConfigError, match="data_file initial_state/none"):
        read_initial_states(missing, tmp_path, source="m/config.pbtxt")
