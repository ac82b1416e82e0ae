"""Triton's identity backend: chosen as Triton chooses it, its configs checked in its words,
its runs copies (served end to end in ``tests/integration/test_identity_backend.py``)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from batchserve.backends.base import Backend
from batchserve.backends.identity import IdentityBackend, identity_problems
from batchserve.backends.selection import create_backend
from batchserve.core.device import CPU
from batchserve.core.errors import BackendError
from batchserve.core.validation import RequestSchema
from batchserve.models.instance_loader import instance_ordinal
from batchserve.models.measured_defaults import wants_tuning
from batchserve.models.memory_probe import declared_profile, probe_backend
from batchserve.models.model_config import parse_pbtxt
from batchserve.models.model_directory import InvalidModel
from batchserve.models.repository import ModelRepository
from batchserve.proto.model_config_pb2 import ModelConfig
from onnx_models import write_model

PAIR = """
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""


def config(text: str = PAIR) -> ModelConfig:
    return parse_pbtxt(text, source="config.pbtxt")


def add(root: Path, name: str, text: str | None) -> Path:
    (root / name / "1").mkdir(parents=True)
    if text is not None:
        (root / name / "config.pbtxt").write_text(text)
    return root / name


def test_a_config_naming_the_backend_is_served_without_a_model_file(tmp_path: Path) -> None:
    add(tmp_path, "ident", PAIR)
    model = ModelRepository(tmp_path).resolve("ident")
    assert model.config.backend == "identity"
    assert model.config.platform == ""
    assert model.config.default_model_filename == "model.identity"
    assert [v.version for v in model.versions] == [1]
    assert [t.name for t in model.config.input] == ["INPUT0"]


def test_an_empty_config_takes_the_backend_from_the_model_name(tmp_path: Path) -> None:
    """L0_model_config custom/empty_config.identity: Triton's last resort, a model named
    ``m.<backend>``; it loads with no inputs and no outputs."""
    add(tmp_path, "empty_config.identity", None)
    model = ModelRepository(tmp_path).resolve("empty_config.identity")
    assert (model.config.backend, model.config.default_model_filename) == (
        "identity",
        "model.identity",
    )
    assert not model.config.input
    assert not model.config.output


def test_a_model_file_comes_before_the_name(tmp_path: Path) -> None:
    """Triton looks at the version directories' files first: ``m.identity`` holding a
    model.onnx is an ONNX model."""
    directory = add(tmp_path, "digits.identity", None)
    write_model(directory / "1" / "model.onnx")
    assert ModelRepository(tmp_path).resolve("digits.identity").config.backend == "onnxruntime"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda c: c.output.add(name="OUTPUT1", data_type=c.output[0].data_type, dims=[4]),
            "model configuration must have equal input/output pairs",
        ),
        (
            lambda c: setattr(c.input[0], "name", "IN0"),
            "expected input name to follow INPUT<index> pattern, got 'IN0'",
        ),
        (
            lambda c: setattr(c.output[0], "name", "RESULT0"),
            "expected output name to follow OUTPUT<index> pattern, got 'RESULT0'",
        ),
        (
            lambda c: setattr(c.output[0], "name", "OUTPUT1"),
            "expected input and output indices to match",
        ),
        (
            lambda c: setattr(c.output[0], "data_type", 11),  # TYPE_FP32
            "expected input and output datatype to match, got TYPE_INT32 and TYPE_FP32",
        ),
        (
            lambda c: c.output[0].dims.append(2),
            "expected input and output shape to match, got [4] and [4,2]",
        ),
        (
            lambda c: c.parameters["execute_delay_ms"].__setattr__("string_value", "soon"),
            "parameter 'execute_delay_ms' must be an integer, got 'soon'",
        ),
    ],
)
def test_configs_tritons_identity_refuses_are_refused_in_its_words(
    tmp_path: Path, change: object, expected: str
) -> None:
    written = config()
    change(written)  # type: ignore[operator]
    assert identity_problems(written) == [expected]
    add(tmp_path, "ident", str(written))
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(tmp_path).resolve("ident")
    assert f"ident/config.pbtxt: {expected}" in caught.value.problems


def test_reshaped_pairs_are_compared_as_the_model_sees_them() -> None:
    """Triton's backend compares ``reshape`` where a tensor has one, not its dims."""
    written = config()
    written.input[0].reshape.shape.extend([2, 2])
    assert identity_problems(written) == ["expected input and output shape to match, got [2,2] "
                                          "and [4]"]  # fmt: skip
    written.output[0].reshape.shape.extend([2, 2])
    assert identity_problems(written) == []


WORDS_PAIR = """
input [ { name: "INPUT1" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def _numbers_and_words() -> Backend:
    """A loaded identity model of two pairs: INT32 [4] and BYTES [1]."""
    written = config(PAIR + WORDS_PAIR)
    backend = create_backend(written, Path("ident/1/model.identity"))
    backend.load(Path("ident/1/model.identity"), written, CPU)
    return backend


def test_a_run_copies_every_input_to_its_output() -> None:
    backend = _numbers_and_words()
    numbers = np.arange(8, dtype=np.int32).reshape(2, 4)
    words = np.array([[b"a"], [b""]], dtype=object)
    got = backend.infer({"INPUT0": numbers, "INPUT1": words})
    np.testing.assert_array_equal(got["OUTPUT0"], numbers)
    assert got["OUTPUT1"].tolist() == [[b"a"], [b""]]
    assert not np.shares_memory(got["OUTPUT0"], numbers)  # the batch's buffers are reused
    assert list(backend.infer({"INPUT0": numbers}, ["OUTPUT0"])) == ["OUTPUT0"]
    assert [t.shape for t in backend.signature.inputs] == [(-1, 4), (-1, 1)]


def test_an_optional_input_left_out_gives_zeros_for_each_row() -> None:
    optional_pair = """
input [ { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1, 3 ] optional: true } ]
output [ { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]
"""
    written = config(PAIR + optional_pair)
    backend = IdentityBackend()
    backend.load(Path("model.identity"), written, CPU)
    got = backend.infer({"INPUT0": np.zeros((2, 4), np.int32)})
    assert got["OUTPUT1"].shape == (2, 1, 3)
    assert got["OUTPUT1"].dtype == np.float32
    assert not got["OUTPUT1"].any()


def test_execute_delay_ms_delays_each_run() -> None:
    written = config()
    written.parameters["execute_delay_ms"].string_value = "30"
    backend = IdentityBackend()
    backend.load(Path("model.identity"), written, CPU)
    started = time.perf_counter()
    backend.infer({"INPUT0": np.zeros((1, 4), np.int32)})
    assert time.perf_counter() - started >= 0.03


def test_instance_wise_delay_multiplier_sets_instances_apart_by_their_place() -> None:
    written = config()
    written.parameters["execute_delay_ms"].string_value = "20"
    written.parameters["instance_wise_delay_multiplier"].string_value = "3"
    slept = []
    for name in ("m-1-0", "m-1-1", "m-1-2"):
        backend = IdentityBackend()
        backend.number_instance(instance_ordinal(name))
        backend.load(Path("model.identity"), written, CPU)
        started = time.perf_counter()
        backend.infer({"INPUT0": np.zeros((1, 4), np.int32)})
        slept.append(time.perf_counter() - started)
    assert slept[0] >= 0.02  # instance 0 waits once, as 1 x 20 ms
    assert slept[1] >= 0.06
    assert slept[2] >= 0.12
    assert instance_ordinal("name-with-dashes-2-7") == 7


def test_a_refused_config_fails_the_load_too() -> None:
    written = config()
    written.output[0].name = "OUT"
    with pytest.raises(BackendError, match="expected output name to follow"):
        IdentityBackend().load(Path("model.identity"), written, CPU)


def test_the_load_measures_no_instances_for_a_copy() -> None:
    assert not wants_tuning(config())


def test_the_load_takes_its_declared_memory_without_running_it() -> None:
    """Probing runs batches of several sizes and warms the cap: with Triton's QA delay of 3 s
    an execution (L0_client_timeout) the load took 20 s, where Triton's takes none."""
    written = config()
    written.parameters["execute_delay_ms"].string_value = "3000"
    backend = create_backend(written, Path("ident/1/model.identity"))
    started = time.perf_counter()
    profile = probe_backend(backend, Path("ident/1/model.identity"), written, CPU)
    assert time.perf_counter() - started < 1.0
    assert (profile.fixed_bytes, profile.per_sample_bytes) == (0, 4 * 4)  # INT32 x [4]
    assert declared_profile(backend) == profile
    # its delay, whatever the batch's size, is where the batcher's batch times start
    assert [(s.batch_size, s.run_ns) for s in profile.samples] == [(1, 3 * 10**9), (2, 3 * 10**9)]
    undelayed = create_backend(config(), Path("ident/1/model.identity"))
    assert probe_backend(undelayed, Path("ident/1/model.identity"), config(), CPU).samples == ()


def test_it_counts_its_input_bytes_as_tritons_backend_does() -> None:
    """Triton's identity backend adds each request's input bytes (BYTES as serialized: a
    4-byte length, then the bytes) to its ``input_byte_size_counter``."""
    backend = _numbers_and_words()
    counters = getattr(backend, "backend_counters")  # noqa: B009 (an optional hook)
    name, doc, value = counters()[0]
    assert (name, value) == ("input_byte_size_counter", 0)
    assert doc == "Cumulative input byte size of all requests received by the model"
    words = np.array([[b"abc"], [b""]], dtype=object)
    backend.infer({"INPUT0": np.zeros((2, 4), np.int32), "INPUT1": words})
    backend.infer({"INPUT0": np.zeros((1, 4), np.int32), "INPUT1": words[:1]})
    assert counters()[0][2] == (32 + 7 + 4) + (16 + 7)


def test_its_responses_carry_tritons_example_parameters_and_others_none() -> None:
    identity = RequestSchema.of(config())
    assert dict(identity.response_parameters) == {
        "param0": "an example string parameter", "param1": 42, "param2": False, "param3": 123.123,
    }  # fmt: skip
    other = config(PAIR.replace('backend: "identity"', 'platform: "onnxruntime_onnx"'))
    assert not RequestSchema.of(other).response_parameters
