"""Warm-up and probe inputs: the implicit synthetic batch and a config's model_warmup samples."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
from batchserve.core.errors import ModelConfigError
from batchserve.models.config_validation import config_problems
from batchserve.models.model_config import parse_pbtxt
from batchserve.models.warmup import SYNTHETIC_BYTES, synthetic_batch, zero_inputs
from batchserve.models.warmup_samples import read_warmup_samples, warmup_problems

STRINGS = """
name: "s"
max_batch_size: 8
input [
  { name: "a" data_type: TYPE_STRING dims: [ 2 ] },
  { name: "n" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "o" data_type: TYPE_FP32 dims: [ 2 ] optional: true }
]
output [{ name: "y" data_type: TYPE_STRING dims: [ 2 ] }]
"""


def _sample(body: str) -> str:
    return STRINGS + f"model_warmup [{{ {body} }}]"


def _strings(values: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def test_implicit_inputs_use_a_parseable_string_and_leave_optional_inputs_out() -> None:
    arrays = zero_inputs(parse_pbtxt(STRINGS), batch_size=3, free_dim=5)
    assert set(arrays) == {"a", "n"}
    assert arrays["a"].shape == (3, 2)
    assert arrays["a"].tolist() == [[SYNTHETIC_BYTES] * 2] * 3
    assert SYNTHETIC_BYTES == b"0"
    assert int(SYNTHETIC_BYTES) == 0
    assert arrays["n"].shape == (3, 5)
    assert not arrays["n"].any()


def test_samples_follow_triton_for_zero_data_and_files(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "strings").write_bytes(_strings([b"12", b"-3"]))
    (tmp_path / "warmup" / "ints").write_bytes(struct.pack("<3i", 7, 8, 9) + b"extra")
    config = parse_pbtxt(
        _sample(
            'name: "w" batch_size: 2 count: 3 '
            'inputs { key: "a" value: { data_type: TYPE_STRING dims: [2] '
            'input_data_file: "strings" } } '
            'inputs { key: "n" value: { data_type: TYPE_INT32 dims: [3] input_data_file: "ints" } }'
        )
    )
    (sample,) = read_warmup_samples(config, tmp_path, source="s/config.pbtxt")
    assert (sample.name, sample.count) == ("w", 3)
    assert sample.inputs["a"].tolist() == [[b"12", b"-3"]] * 2
    assert sample.inputs["n"].tolist() == [[7, 8, 9]] * 2  # bytes past the tensor are ignored
    batch = synthetic_batch(config, 5, 1, sample.inputs)
    assert batch["n"].shape == (5, 3)
    assert batch["a"][4].tolist() == [b"12", b"-3"]


def test_zero_and_random_strings_are_empty_as_in_triton(tmp_path: Path) -> None:
    config = parse_pbtxt(
        _sample(
            'batch_size: 1 inputs { key: "a" value: { data_type: TYPE_STRING dims: [2] '
            "random_data: true } } "
            'inputs { key: "n" value: { data_type: TYPE_INT32 dims: [4] zero_data: true } }'
        )
    )
    (sample,) = read_warmup_samples(config, tmp_path, source="s/config.pbtxt")
    assert sample.count == 1  # count 0 means once
    assert sample.inputs["a"].tolist() == [[b"", b""]]
    assert sample.inputs["n"].tolist() == [[0, 0, 0, 0]]


def test_batch_size_zero_samples_are_skipped(tmp_path: Path) -> None:
    config = parse_pbtxt(_sample('name: "none" batch_size: 0'))
    assert read_warmup_samples(config, tmp_path, source="s/config.pbtxt") == ()


@pytest.mark.parametrize(
    ("file", "content", "message"),
    [
        ("short", struct.pack("<2i", 1, 2), "warmup setting expects 12 bytes, but the data "
         "provided from short only has 8 bytes"),
        ("missing", None, "input_data_file warmup/missing cannot be read: No such file"),
        ("fifo", "fifo", "input_data_file warmup/fifo is not a regular file"),
        ("loop", "loop", "input_data_file warmup/loop is a symlink loop"),
    ],
)  # fmt: skip
def test_unusable_files_are_config_errors(
    tmp_path: Path, file: str, content: bytes | str | None, message: str
) -> None:
    (tmp_path / "warmup").mkdir()
    if content == "fifo":  # reading it would wait for a writer forever
        os.mkfifo(tmp_path / "warmup" / file)
    elif content == "loop":  # a link to itself used to raise out of the load
        (tmp_path / "warmup" / file).symlink_to(file)
    elif content is not None:
        (tmp_path / "warmup" / file).write_bytes(content)
    config = parse_pbtxt(
        _sample(
            f'name: "w" batch_size: 1 inputs {{ key: "a" value: {{ data_type: TYPE_STRING '
            f'dims: [2] zero_data: true }} }} inputs {{ key: "n" value: {{ data_type: TYPE_INT32 '
            f'dims: [3] input_data_file: "{file}" }} }}'
        )
    )
    with pytest.raises(ModelConfigError, match="model_warmup\\[0\\] 'w'") as caught:
        read_warmup_samples(config, tmp_path, source="s/config.pbtxt")
    assert message in caught.value.message


def test_a_file_outside_the_warmup_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "link").symlink_to(tmp_path / "config.pbtxt")
    config = parse_pbtxt(
        _sample(
            'batch_size: 1 inputs { key: "a" value: { data_type: TYPE_STRING dims: [2] '
            'input_data_file: "link" } } '
            'inputs { key: "n" value: { data_type: TYPE_INT32 dims: [1] zero_data: true } }'
        )
    )
    with pytest.raises(ModelConfigError, match="leads outside warmup/"):
        read_warmup_samples(config, tmp_path, source="s/config.pbtxt")


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('name: "big" batch_size: 9', "batch_size 9 exceeds max_batch_size 8"),
        ('name: "x" batch_size: 1 inputs { key: "zz" value: { data_type: TYPE_INT32 dims: [1] '
         'zero_data: true } }', "input 'zz' is not an input of the model"),
        ('name: "x" batch_size: 1 inputs { key: "n" value: { data_type: TYPE_INT32 dims: [-1] '
         'zero_data: true } }', "warmup setting expects all variable-size dimensions are "
         "specified"),
        ('name: "x" batch_size: 1 inputs { key: "a" value: { data_type: TYPE_INT32 dims: [2] '
         'zero_data: true } }', "input 'a': data_type differs"),
        ('name: "x" batch_size: 1 inputs { key: "a" value: { data_type: TYPE_STRING dims: [3] '
         'zero_data: true } }', "dims [3] do not fit the input's dims [2]"),
        ('name: "x" batch_size: 1 inputs { key: "a" value: { data_type: TYPE_STRING dims: [2] '
         '} }', "set one of zero_data, random_data or input_data_file"),
        ('name: "x" batch_size: 1 inputs { key: "a" value: { data_type: TYPE_STRING dims: [2] '
         'input_data_file: "../config.pbtxt" } }', "must be a path inside warmup/"),
        ('name: "x" batch_size: 1', "gives no data for required input(s) ['a', 'n']"),
        ('name: "x" batch_size: 1 count: 4000000000', "count 4000000000 is over 10000"),
    ],
)  # fmt: skip
def test_sample_problems_name_the_sample_and_input(body: str, problem: str) -> None:
    problems = warmup_problems(parse_pbtxt(_sample(body)))
    assert any(problem in p for p in problems), problems
    assert all(p.startswith("model_warmup[0] ") for p in problems)


def test_sample_problems_are_config_problems() -> None:
    config = parse_pbtxt(_sample('name: "big" batch_size: 9'))
    problems = config_problems(config, source="s/config.pbtxt", directory="s")
    assert "s/config.pbtxt: model_warmup[0] 'big': batch_size 9 exceeds max_batch_size 8" in (
        problems
    )


def test_a_model_that_does_not_batch_takes_samples_of_one(tmp_path: Path) -> None:
    config = parse_pbtxt(
        STRINGS.replace("max_batch_size: 8", "max_batch_size: 0")
        + "model_warmup [{ batch_size: 2 }]"
    )
    assert any("batch_size 2 must be 1" in p for p in warmup_problems(config))
    single = parse_pbtxt(
        STRINGS.replace("max_batch_size: 8", "max_batch_size: 0")
        + 'model_warmup [{ batch_size: 1 inputs { key: "a" value: { data_type: TYPE_STRING '
        'dims: [2] zero_data: true } } inputs { key: "n" value: { data_type: TYPE_INT32 '
        "dims: [3] zero_data: true } } }]"
    )
    (sample,) = read_warmup_samples(single, tmp_path, source="s/config.pbtxt")
    assert sample.inputs["n"].shape == (3,)  # no batch axis
    assert synthetic_batch(single, 4, 1, sample.inputs)["n"].shape == (3,)
    assert isinstance(sample.inputs["a"], np.ndarray)
