import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.backends.onnx_errors import translate_ort_error
from batchserve.backends.onnx_options import CPU_EP, CUDA_EP
from batchserve.backends.onnx_session import _one_onnxruntime
from batchserve.core.device import CPU, Device
from batchserve.core.errors import (
    BackendError,
    DeviceUnavailable,
    InvalidArgument,
    ModelConfigError,
    OutOfMemory,
)
from batchserve.core.signature import DYNAMIC
from batchserve.devices.placement import gpu_count
from batchserve.proto.model_config_pb2 import BatchserveOptions, ModelConfig
from onnx import TensorProto, helper

Reference = Callable[[np.ndarray], dict[str, np.ndarray]]
HAS_CUDA_EP = CUDA_EP in ort.get_available_providers()


def loaded(path: Path, config: ModelConfig, **kwargs: object) -> OnnxBackend:
    backend = OnnxBackend(**kwargs)  # type: ignore[arg-type]
    backend.load(path, config, CPU)
    return backend


def test_mlp_outputs_match_numpy(mlp_file: Path, config: ModelConfig, mlp_reference: Reference):
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    out = loaded(mlp_file, config).infer({"x": x})
    want = mlp_reference(x)
    assert set(out) == {"y", "hidden"}
    np.testing.assert_allclose(out["y"], want["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["hidden"], want["hidden"], rtol=1e-5, atol=1e-6)


def test_output_selection_returns_only_what_was_asked(mlp_file: Path, config: ModelConfig):
    out = loaded(mlp_file, config).infer({"x": np.ones((2, 8), np.float32)}, ["hidden"])
    assert list(out) == ["hidden"]
    assert out["hidden"].shape == (2, 4)


def test_io_binding_gives_the_same_answer(mlp_file: Path, config: ModelConfig):
    x = np.random.default_rng(2).standard_normal((5, 8)).astype(np.float32)
    plain = loaded(mlp_file, config).infer({"x": x})
    bound = loaded(mlp_file, config, io_binding=True).infer({"x": x[:, :]}, ["y", "hidden"])
    for name in ("y", "hidden"):
        np.testing.assert_array_equal(bound[name], plain[name])


def test_int64_model(int64_file: Path, config: ModelConfig):
    ids = np.array([[1, 2, 3], [-4, 5, 2**40]], np.int64)
    out = loaded(int64_file, config).infer({"ids": ids})
    assert out["out"].dtype == np.int64
    np.testing.assert_array_equal(out["out"], ids * 3 + 7)


def test_dynamic_batch_and_sequence_axes(sequence_file: Path, config: ModelConfig):
    backend = loaded(sequence_file, config)
    tokens = backend.signature.inputs[0]
    assert tokens.shape == (DYNAMIC, DYNAMIC, 4)
    assert tokens.axis_names == ("batch", "seq", None)
    assert backend.signature.outputs[0].axis_names == ("batch", None)
    for batch, seq in [(1, 1), (3, 7), (2, 50)]:
        x = np.random.default_rng(seq).standard_normal((batch, seq, 4)).astype(np.float32)
        out = backend.infer({"tokens": x})["pooled"]
        np.testing.assert_allclose(out, x.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_fp16_model(fp16_file: Path, config: ModelConfig):
    backend = loaded(fp16_file, config)
    assert backend.signature.inputs[0].datatype.wire == "FP16"
    x = np.array([[0, 1, -2, 65000]], np.float16)
    out = backend.infer({"x": x})["y"]
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, x * np.float16(0.5) + np.float16(1))


def test_signature_comes_from_the_session(mlp_file: Path, config: ModelConfig):
    signature = loaded(mlp_file, config).signature
    assert [(t.name, t.datatype.wire, t.shape) for t in signature.inputs] == [
        ("x", "FP32", (DYNAMIC, 8))
    ]
    assert [t.name for t in signature.outputs] == ["y", "hidden"]
    assert signature.batches_on_first_axis()


def test_wrong_dtype_names_the_tensor(int64_file: Path, config: ModelConfig):
    backend = loaded(int64_file, config)
    with pytest.raises(InvalidArgument, match=r"model 'm': input 'ids' .*float32.*INT64"):
        backend.infer({"ids": np.ones((1, 3), np.float32)})


def test_wrong_rank_names_the_tensor(mlp_file: Path, config: ModelConfig):
    backend = loaded(mlp_file, config)
    with pytest.raises(InvalidArgument, match=r"model 'm': Invalid rank for input: x"):
        backend.infer({"x": np.ones((2, 8, 1), np.float32)})


def test_wrong_dimension_names_the_tensor(mlp_file: Path, config: ModelConfig):
    with pytest.raises(InvalidArgument, match=r"invalid dimensions for input: x"):
        loaded(mlp_file, config).infer({"x": np.ones((2, 7), np.float32)})


def test_missing_input_and_unknown_output_are_invalid(mlp_file: Path, config: ModelConfig):
    backend = loaded(mlp_file, config)
    with pytest.raises(InvalidArgument, match=r"\(\['x'\]\) are missing"):
        backend.infer({})
    with pytest.raises(InvalidArgument, match="nope"):
        backend.infer({"x": np.ones((1, 8), np.float32)}, ["nope"])


def test_cpu_arena_cap_gives_out_of_memory_then_recovers(wide_file: Path, config: ModelConfig):
    backend = loaded(wide_file, config, memory_limit_bytes=2 << 20)
    with pytest.raises(OutOfMemory, match=r"model 'm': .*Available memory of \d+ is smaller"):
        backend.infer({"x": np.ones((1024, 64), np.float32)})  # 4 MiB output
    out = backend.infer({"x": np.ones((8, 64), np.float32)})["y"]
    np.testing.assert_allclose(out, np.full((8, 1024), 0.64, np.float32), rtol=1e-5)


def test_sessions_without_a_cap_are_not_capped(wide_file: Path, config: ModelConfig):
    loaded(wide_file, config, memory_limit_bytes=2 << 20)
    out = loaded(wide_file, config).infer({"x": np.ones((1024, 64), np.float32)})
    assert out["y"].shape == (1024, 1024)


def test_each_capped_session_gets_its_own_arena(wide_file: Path, config: ModelConfig):
    first = loaded(wide_file, config, memory_limit_bytes=3 << 20)
    second = loaded(wide_file, config, memory_limit_bytes=3 << 20)
    batch = np.ones((300, 64), np.float32)  # ~2.7 MiB with the weights: two would not fit in one
    first.infer({"x": batch})
    second.infer({"x": batch})
    with pytest.raises(OutOfMemory):
        first.infer({"x": np.ones((600, 64), np.float32)})


def test_cap_below_the_weights_is_refused(wide_file: Path, config: ModelConfig):
    with pytest.raises(ModelConfigError, match=r"wide\.onnx.*must hold the weights"):
        loaded(wide_file, config, memory_limit_bytes=64 << 10)


def test_unreadable_files_are_config_errors_naming_the_file(tmp_path: Path, config: ModelConfig):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(ModelConfigError, match=r"garbage\.onnx.*Protobuf parsing failed"):
        loaded(garbage, config)
    with pytest.raises(ModelConfigError, match=r"absent\.onnx"):
        loaded(tmp_path / "absent.onnx", config)
    with pytest.raises(ModelConfigError, match=r"absent\.onnx"):
        loaded(tmp_path / "absent.onnx", config, memory_limit_bytes=1 << 20)


def test_unsupported_operator_is_a_config_error(
    tmp_path: Path, config: ModelConfig, build_onnx: Callable[..., Path]
):
    path = build_onnx(
        tmp_path / "custom.onnx",
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="example.custom")],
        [("x", TensorProto.FLOAT, [1])],
        [("y", TensorProto.FLOAT, [1])],
        domains=["example.custom"],
    )
    with pytest.raises(ModelConfigError, match=r"custom\.onnx.*Frobnicate"):
        loaded(path, config)


@pytest.mark.skipif(HAS_CUDA_EP, reason="this onnxruntime has the CUDA provider")
def test_gpu_instance_without_cuda_provider_is_device_unavailable(mlp_file: Path):
    with pytest.raises(DeviceUnavailable) as caught:
        OnnxBackend().load(mlp_file, ModelConfig(name="m"), Device("gpu", 0))
    message = str(caught.value)
    assert str(mlp_file) in message
    assert "CPUExecutionProvider" in message
    assert "pip install 'batchserve[gpu]'" in message
    assert "allow_cpu_fallback" in message


@pytest.mark.skipif(HAS_CUDA_EP, reason="this onnxruntime has the CUDA provider")
def test_gpu_instance_falls_back_to_cpu_when_allowed(
    mlp_file: Path, mlp_reference: Reference, caplog: pytest.LogCaptureFixture
):
    config = ModelConfig(name="m", batchserve=BatchserveOptions(allow_cpu_fallback=True))
    backend = OnnxBackend()
    with caplog.at_level(logging.WARNING, logger="batchserve.backends.onnx"):
        backend.load(mlp_file, config, Device("gpu", 0))
    assert backend.device == CPU
    assert "running on the CPU" in caplog.text
    x = np.ones((2, 8), np.float32)
    np.testing.assert_allclose(backend.infer({"x": x})["y"], mlp_reference(x)["y"], rtol=1e-5)


# ONNX Runtime drops a provider it cannot start and builds the session without it: it did so
# after any provider failure before 1.31's enable_fallback=0, and still does for a provider the
# wheel lacks. Claiming a CUDA provider this CPU wheel lacks makes real ORT do exactly that.
@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
@pytest.mark.skipif(HAS_CUDA_EP, reason="this onnxruntime has the CUDA provider")
def test_a_gpu_session_quietly_rebuilt_on_the_cpu_is_refused(
    mlp_file: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA_EP, CPU_EP])
    with pytest.raises(DeviceUnavailable) as caught:
        OnnxBackend().load(mlp_file, ModelConfig(name="m"), Device("gpu", 0))
    message = str(caught.value)
    assert f"could not start {CUDA_EP} on gpu:0" in message
    assert f"runs {CPU_EP} instead of {CUDA_EP}, {CPU_EP}" in message
    assert "CUDA 13 and cuDNN 9" in message
    assert "allow_cpu_fallback" in message


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
@pytest.mark.skipif(HAS_CUDA_EP, reason="this onnxruntime has the CUDA provider")
def test_a_quiet_rebuild_becomes_an_explicit_cpu_session_when_allowed(
    mlp_file: Path,
    mlp_reference: Reference,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA_EP, CPU_EP])
    config = ModelConfig(name="m", batchserve=BatchserveOptions(allow_cpu_fallback=True))
    backend = OnnxBackend()
    with caplog.at_level(logging.WARNING, logger="batchserve.backends.onnx"):
        backend.load(mlp_file, config, Device("gpu", 0))
    assert backend.device == CPU
    assert f"instead of {CUDA_EP}, {CPU_EP}; running on the CPU" in caplog.text
    x = np.ones((3, 8), np.float32)
    np.testing.assert_allclose(backend.infer({"x": x})["y"], mlp_reference(x)["y"], rtol=1e-5)


def test_unload_is_idempotent_and_stops_inference(mlp_file: Path, config: ModelConfig):
    backend = loaded(mlp_file, config)
    assert backend.memory_bytes() is None
    backend.unload()
    backend.unload()
    with pytest.raises(BackendError, match="model 'm' is not loaded"):
        backend.infer({"x": np.ones((1, 8), np.float32)})


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RuntimeError("CUDA failure 2: out of memory ; GPU=0"), OutOfMemory),
        (RuntimeError("std::bad_alloc"), OutOfMemory),
        (
            RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : BFCArena::Extend"),
            OutOfMemory,
        ),
        (RuntimeError("Failed to allocate memory for requested buffer of size 99"), OutOfMemory),
        (MemoryError(), OutOfMemory),
        (ValueError("Required inputs (['x']) are missing"), InvalidArgument),
        (
            RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Gather index -9"),
            BackendError,
        ),
    ],
)
def test_translation_of_runtime_messages(error: Exception, expected: type[Exception]):
    translated = translate_ort_error(error, "model 'm'")
    assert type(translated) is expected
    assert translated.message.startswith("model 'm': ")
    assert "[ONNXRuntimeError]" not in translated.message


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() == 0 or not HAS_CUDA_EP, reason="needs a GPU and onnxruntime-gpu")
def test_cuda_provider_matches_numpy(mlp_file: Path, config: ModelConfig, mlp_reference: Reference):
    backend = OnnxBackend(memory_limit_bytes=256 << 20)
    backend.load(mlp_file, config, Device("gpu", 0))
    assert backend.device == Device("gpu", 0)
    x = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    out = backend.infer({"x": x}, ["y"])
    np.testing.assert_allclose(out["y"], mlp_reference(x)["y"], rtol=1e-4, atol=1e-5)
    backend.unload()


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() == 0 or not HAS_CUDA_EP, reason="needs a GPU and onnxruntime-gpu")
def test_cuda_graphs_per_preferred_size_pad_batches_and_match_numpy(
    mlp_file: Path, mlp_reference: Reference
):
    from google.protobuf import text_format

    config = text_format.Parse(
        "max_batch_size: 16 dynamic_batching { preferred_batch_size: [4, 8] } "
        "optimization { cuda { graphs: true } }",
        ModelConfig(name="m"),
    )
    backend = OnnxBackend()
    backend.load(mlp_file, config, Device("gpu", 0))
    assert backend.graph_batch_sizes == (4, 8)
    for batch in (4, 3, 8, 5, 12, 1):  # graphs for 4 and 8; 12 runs without one
        x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
        out = backend.infer({"x": x})
        assert out["y"].shape == (batch, 4)
        np.testing.assert_allclose(out["y"], mlp_reference(x)["y"], rtol=1e-4, atol=1e-5)
    backend.unload()


def test_both_onnxruntime_wheels_installed_is_refused_naming_both(
    mlp_file: Path, config: ModelConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    dist_info = tmp_path / "onnxruntime_gpu-1.31.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: 1.31.1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    _one_onnxruntime.cache_clear()
    try:
        with pytest.raises(
            DeviceUnavailable,
            match=r"both onnxruntime \S+ and onnxruntime-gpu "
            r"1\.31\.1 are installed",
        ):
            loaded(mlp_file, config)
    finally:
        _one_onnxruntime.cache_clear()
