import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from batchserve.backends.tensorrt import TensorRTBackend, map_trt_errors
from batchserve.backends.tensorrt_engine import read_engine_signature
from batchserve.backends.tensorrt_profiles import (
    EngineTensor,
    Profile,
    check_inputs,
    datatype_from_trt,
    instance_profiles,
    pick_profile,
    union_tensor,
)
from batchserve.core.datatypes import BY_WIRE
from batchserve.core.device import Device
from batchserve.core.errors import (
    BackendError,
    DeviceUnavailable,
    InvalidArgument,
    ModelConfigError,
    OutOfMemory,
)
from batchserve.core.signature import DYNAMIC
from batchserve.devices.placement import gpu_count
from batchserve.proto.model_config_pb2 import ModelConfig
from google.protobuf import text_format

HAS_GPU = gpu_count() > 0
HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
PLAN = Path("repo/m/1/model.plan")
FP32 = BY_WIRE["FP32"]
TOKENS = EngineTensor("tokens", FP32, True, (1, 1, 4), (8, 128, 4))
POOLED = EngineTensor("pooled", FP32, False, (8, 4), (8, 4))


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_load_without_a_gpu_says_what_is_missing_and_how_to_fix(tmp_path: Path):
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"engine")
    with pytest.raises(DeviceUnavailable) as caught:
        TensorRTBackend().load(plan, ModelConfig(name="m"), Device("gpu", 0))
    message = str(caught.value)
    assert str(plan) in message
    assert "no NVIDIA GPU is visible" in message
    assert ("tensorrt package is not installed" in message) == (not HAS_TENSORRT)
    assert "pip install 'batchserve[gpu]'" in message


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_read_engine_signature_without_a_gpu_is_device_unavailable(tmp_path: Path):
    with pytest.raises(DeviceUnavailable, match=r"model\.plan: a TensorRT engine needs"):
        read_engine_signature(tmp_path / "model.plan")


def test_an_unloaded_backend_holds_nothing():
    backend = TensorRTBackend()
    assert backend.memory_bytes() is None
    backend.unload()
    backend.unload()


def test_inputs_inside_the_profile_pass():
    check_inputs([TOKENS, POOLED], {"tokens": np.zeros((8, 128, 4), np.float32)}, "m")
    check_inputs([TOKENS, POOLED], {"tokens": np.zeros((1, 1, 4), np.float32)}, "m")


@pytest.mark.parametrize(
    ("inputs", "match"),
    [
        (
            {"tokens": np.zeros((9, 10, 4), np.float32)},
            r"\[9, 10, 4\].*\[1, 1, 4\] to \[8, 128, 4\]",
        ),
        ({"tokens": np.zeros((2, 129, 4), np.float32)}, "input 'tokens' has shape"),
        ({"tokens": np.zeros((2, 4), np.float32)}, "input 'tokens' has shape"),
        ({"tokens": np.zeros((2, 3, 4), np.float64)}, "'tokens' has numpy dtype float64.*FP32"),
        ({}, r"missing \['tokens'\]"),
        ({"tokens": np.zeros((1, 1, 4), np.float32), "x": np.zeros(1)}, r"unknown \['x'\]"),
    ],
)
def test_inputs_outside_the_profile_are_invalid(inputs: dict[str, np.ndarray], match: str):
    with pytest.raises(InvalidArgument, match=f"model 'm': .*{match}"):
        check_inputs([TOKENS, POOLED], inputs, "m")


def test_max_bytes_sizes_the_buffers():
    assert TOKENS.max_bytes == 8 * 128 * 4 * 4
    assert EngineTensor("h", BY_WIRE["FP16"], False, (2, 3), (2, 3)).max_bytes == 12


def config(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig(name="m"))


@pytest.mark.parametrize(
    ("text", "device", "expected"),
    [
        ("", 0, (0, 1, 2)),  # no profile listed: every profile, chosen per batch
        ("instance_group { kind: KIND_GPU profile: ['1'] }", 0, (1,)),
        ("instance_group { kind: KIND_GPU gpus: [1] profile: ['2'] }", 0, (0, 1, 2)),
        (
            "instance_group { kind: KIND_GPU gpus: [0] profile: ['2'] } "
            "instance_group { kind: KIND_GPU gpus: [1] profile: ['1', '2'] }",
            1,
            (1, 2),
        ),
        ("instance_group { kind: KIND_CPU profile: ['1'] }", 0, (0, 1, 2)),
    ],
)
def test_profiles_come_from_the_group_covering_the_gpu(
    text: str, device: int, expected: tuple[int, ...]
):
    assert instance_profiles(config(text), Device("gpu", device), 3, PLAN) == expected


@pytest.mark.parametrize(
    "profile", ["3", "first", "\u00b2", "9" * 5000]
)  # int() refuses the last two
def test_a_profile_the_engine_lacks_is_a_config_error(profile: str):
    text = f"instance_group {{ kind: KIND_GPU profile: ['{profile}'] }}"
    with pytest.raises(ModelConfigError, match=rf"model\.plan: .*'{profile}'.*3 optimisation"):
        instance_profiles(config(text), Device("gpu", 0), 3, PLAN)


def images(low: int, high: int) -> EngineTensor:
    return EngineTensor("image", FP32, True, (low, 3, 8, 8), (high, 3, 8, 8))


# What `batchserve export --tensorrt --preferred-batch-size 4 16 --max-batch-size 32` builds.
PROFILES = [
    Profile(0, {"image": images(1, 4)}, 4),
    Profile(1, {"image": images(5, 16)}, 16),
    Profile(2, {"image": images(17, 32)}, 32),
]


@pytest.mark.parametrize(("batch", "expected"), [(1, 0), (4, 0), (5, 1), (16, 1), (17, 2)])
def test_each_batch_runs_on_the_profile_whose_range_holds_it(batch: int, expected: int):
    inputs = {"image": np.zeros((batch, 3, 8, 8), np.float32)}
    assert pick_profile(PROFILES, inputs) == expected


def test_overlapping_profiles_prefer_the_one_tuned_nearest_above():
    overlapping = [
        Profile(0, {"image": images(1, 32)}, 32),
        Profile(1, {"image": images(1, 8)}, 8),
    ]
    small = {"image": np.zeros((3, 3, 8, 8), np.float32)}
    large = {"image": np.zeros((20, 3, 8, 8), np.float32)}
    assert pick_profile(overlapping, small) == 1
    assert pick_profile(overlapping, large) == 0


def test_no_profile_for_shapes_outside_every_range():
    assert pick_profile(PROFILES, {"image": np.zeros((2, 3, 9, 8), np.float32)}) is None
    assert pick_profile(PROFILES, {"image": np.zeros((33, 3, 8, 8), np.float32)}) is None


def test_union_of_profiles_accepts_all_of_them_and_sizes_buffers_for_the_largest():
    union = union_tensor([p.inputs["image"] for p in PROFILES])
    assert (union.min_shape, union.max_shape) == ((1, 3, 8, 8), (32, 3, 8, 8))
    assert union.max_bytes == 32 * 3 * 8 * 8 * 4


@pytest.mark.parametrize(
    ("trt_name", "wire"),
    [("FLOAT", "FP32"), ("HALF", "FP16"), ("BF16", "BF16"), ("INT64", "INT64"), ("BOOL", "BOOL")],
)
def test_tensorrt_types_map_to_protocol_types(trt_name: str, wire: str):
    assert datatype_from_trt(trt_name, "t", PLAN).wire == wire


def test_tensorrt_types_without_a_protocol_type_are_config_errors():
    with pytest.raises(ModelConfigError, match="tensor 't' has TensorRT type FP8"):
        datatype_from_trt("FP8", "t", PLAN)


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (RuntimeError("CUDA error: out of memory"), OutOfMemory),
        (MemoryError(), OutOfMemory),
        (TypeError("execute_async_v3(): incompatible function arguments"), BackendError),
        (InvalidArgument("already ours"), InvalidArgument),
    ],
)
def test_tensorrt_exceptions_are_translated_at_one_boundary(raised: Exception, expected: type):
    with (
        pytest.raises(expected, match=r"^(model 'm': |already ours)") as caught,
        map_trt_errors("model 'm'"),
    ):
        raise raised
    assert type(caught.value) is expected


def build_engine(
    onnx_file: Path, plan: Path, max_batch: int, profiles: tuple[tuple[int, int, int], ...] = ()
) -> Path:
    """A TensorRT plan for the mlp model: one profile 1..max_batch, or the (min, opt, max)."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(onnx_file.read_bytes()), parser.get_error(0)
    build_config = builder.create_builder_config()
    build_config.clear_flag(trt.BuilderFlag.TF32)  # on by default; the tolerances are FP32's
    for low, opt, high in profiles or ((1, max_batch // 2, max_batch),):
        profile = builder.create_optimization_profile()
        profile.set_shape("x", (low, 8), (opt, 8), (high, 8))
        build_config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, build_config)
    plan.write_bytes(bytes(serialized))
    return plan


@pytest.fixture
def mlp_plan(mlp_file: Path, tmp_path: Path) -> Path:
    pytest.importorskip("tensorrt")
    return build_engine(mlp_file, tmp_path / "model.plan", max_batch=16)


gpu = pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")


@pytest.mark.gpu
@gpu
def test_engine_runs_and_matches_numpy(
    mlp_plan: Path, mlp_reference: Callable[[np.ndarray], dict[str, np.ndarray]]
):
    backend = TensorRTBackend()
    backend.load(mlp_plan, ModelConfig(name="m"), Device("gpu", 0))
    assert backend.device == Device("gpu", 0)
    for batch in (1, 5, 16):
        x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
        out = backend.infer({"x": x})
        want = mlp_reference(x)
        np.testing.assert_allclose(out["y"], want["y"], rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(out["hidden"], want["hidden"], rtol=1e-3, atol=1e-4)
    assert list(backend.infer({"x": np.ones((2, 8), np.float32)}, ["y"])) == ["y"]
    memory = backend.memory_bytes()
    assert memory is not None
    assert memory >= 16 * (8 + 4 + 4) * 4
    backend.unload()
    backend.unload()
    assert backend.memory_bytes() is None


@pytest.mark.gpu
@gpu
def test_engine_refuses_batches_beyond_its_profile(mlp_plan: Path):
    backend = TensorRTBackend()
    backend.load(mlp_plan, ModelConfig(name="m"), Device("gpu", 0))
    with pytest.raises(InvalidArgument, match=r"input 'x' has shape \[17, 8\].*\[16, 8\]"):
        backend.infer({"x": np.ones((17, 8), np.float32)})
    with pytest.raises(InvalidArgument, match=r"unknown outputs \['nope'\]"):
        backend.infer({"x": np.ones((1, 8), np.float32)}, ["nope"])
    backend.unload()


@pytest.mark.gpu
@gpu
def test_engine_signature_has_dynamic_batch(mlp_plan: Path):
    signature = read_engine_signature(mlp_plan)
    assert [(t.name, t.datatype.wire, t.shape) for t in signature.inputs] == [
        ("x", "FP32", (DYNAMIC, 8))
    ]
    assert {t.name for t in signature.outputs} == {"y", "hidden"}


@pytest.mark.gpu
@gpu
def test_a_file_that_is_not_an_engine_is_a_config_error(tmp_path: Path):
    pytest.importorskip("tensorrt")
    bad = tmp_path / "bad.plan"
    bad.write_bytes(b"not an engine")
    with pytest.raises(ModelConfigError, match=r"bad\.plan: TensorRT .* cannot deserialise"):
        TensorRTBackend().load(bad, ModelConfig(name="m"), Device("gpu", 0))


@pytest.mark.gpu
@gpu
def test_batches_run_on_each_profile_and_as_padded_cuda_graphs(
    mlp_file: Path, tmp_path: Path, mlp_reference: Callable[[np.ndarray], dict[str, np.ndarray]]
):
    pytest.importorskip("tensorrt")
    plan = build_engine(mlp_file, tmp_path / "model.plan", 16, ((1, 4, 4), (5, 16, 16)))
    graphs = config(
        "max_batch_size: 16 dynamic_batching { preferred_batch_size: [4, 16] } "
        "optimization { cuda { graphs: true } }"
    )
    for model_config, sizes in ((ModelConfig(name="m"), ()), (graphs, (4, 16))):
        backend = TensorRTBackend()
        backend.load(plan, model_config, Device("gpu", 0))
        assert backend.graph_batch_sizes == sizes
        for batch in (1, 3, 4, 5, 11, 16, 2):  # both profiles; padded up to 4 or 16
            x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
            out = backend.infer({"x": x})
            assert out["y"].shape == (batch, 4)
            np.testing.assert_allclose(out["y"], mlp_reference(x)["y"], rtol=1e-3, atol=1e-4)
        backend.unload()
