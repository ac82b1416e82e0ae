"""BF16 through ONNX Runtime: carried as uint16 in batchserve, bound as bfloat16 for ORT."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from batchserve.backends.onnx import OnnxBackend
from batchserve.backends.onnx_io import BoundRunner, HostMemory, IoLayout
from batchserve.backends.onnx_session import session_signature
from batchserve.core.device import CPU
from batchserve.proto.model_config_pb2 import ModelConfig
from onnx import TensorProto, helper

BF16, FP32, UINT16 = TensorProto.BFLOAT16, TensorProto.FLOAT, TensorProto.UINT16


def bf16_bits(*values: float) -> np.ndarray:
    """bfloat16 values as batchserve carries them: their bits, in uint16."""
    return np.array(values, dtype=ml_dtypes.bfloat16).view(np.uint16)


# Every kind of value: normal, negative, largest finite, infinities, the smallest subnormal,
# negative zero, and a NaN with payload bits that any float round trip would lose.
ODD_BITS = np.concatenate(
    [bf16_bits(1.5, -0.1, 3.3895e38, np.inf, -np.inf, 9.2e-41, -0.0), [0x7FC1]]
).astype(np.uint16)


@pytest.fixture
def bf16_file(tmp_path: Path, build_onnx: Callable[..., Path]) -> Path:
    """y = x (BF16) and f = float(x) (FP32), with a free axis after the batch axis."""
    return build_onnx(
        tmp_path / "bf16.onnx",
        [
            helper.make_node("Identity", ["x"], ["y"]),
            helper.make_node("Cast", ["x"], ["f"], to=FP32),
        ],
        [("x", BF16, ["N", "d"])],
        [("y", BF16, ["N", "d"]), ("f", FP32, ["N", "d"])],
    )


@pytest.mark.parametrize("io_binding", [None, True])
@pytest.mark.parametrize("batch", [1, 3, 9])  # 9: beyond max_batch_size's buffers
def test_bf16_values_round_trip_bit_exact(
    bf16_file: Path, io_binding: bool | None, batch: int
) -> None:
    backend = OnnxBackend(io_binding=io_binding)
    backend.load(bf16_file, ModelConfig(name="m", max_batch_size=8), CPU)
    x = np.tile(ODD_BITS, (batch, 1))
    out = backend.infer({"x": x})
    assert out["y"].dtype == np.uint16
    np.testing.assert_array_equal(out["y"], x)
    expected = x.view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(out["f"], expected)  # NaN positions compare equal too
    backend.unload()


def test_bf16_rows_fixed_apart_from_the_batch_go_through_the_buffers(
    tmp_path: Path, build_onnx: Callable[..., Path]
) -> None:
    """Buffers sized once are bound with ORT's bfloat16 type, not numpy's uint16."""
    path = build_onnx(
        tmp_path / "fixed.onnx",
        [helper.make_node("Identity", ["x"], ["y"])],
        [("x", BF16, ["N", len(ODD_BITS)])],
        [("y", BF16, ["N", len(ODD_BITS)])],
    )
    backend = OnnxBackend(io_binding=True)
    backend.load(path, ModelConfig(name="m", max_batch_size=4), CPU)
    for batch in (4, 2, 5):
        x = np.tile(ODD_BITS, (batch, 1)) ^ np.uint16(batch)
        np.testing.assert_array_equal(backend.infer({"x": x})["y"], x)


def test_an_empty_bf16_batch_comes_back_empty(bf16_file: Path) -> None:
    backend = OnnxBackend()
    backend.load(bf16_file, ModelConfig(name="m", max_batch_size=8), CPU)
    out = backend.infer({"x": np.zeros((1, 0), np.uint16)})
    assert (out["y"].shape, out["y"].dtype) == ((1, 0), np.dtype(np.uint16))
    assert out["f"].shape == (1, 0)


def test_uint16_models_are_not_taken_for_bf16(
    tmp_path: Path, build_onnx: Callable[..., Path]
) -> None:
    """Both travel as numpy uint16; a UINT16 model must still get plain uint16 tensors."""
    path = build_onnx(
        tmp_path / "u16.onnx",
        [helper.make_node("Identity", ["x"], ["y"])],
        [("x", UINT16, ["N", "d"])],
        [("y", UINT16, ["N", "d"])],
    )
    backend = OnnxBackend()
    backend.load(path, ModelConfig(name="m", max_batch_size=8), CPU)
    x = ODD_BITS.reshape(1, -1)
    np.testing.assert_array_equal(backend.infer({"x": x})["y"], x)


class DeviceLikeMemory(HostMemory):
    """Host buffers that call themselves a GPU's, as ``CudaMemory``'s do."""

    device_type = "cuda"


class RecordingBinding:
    """A real binding that records where each output was asked for and keeps all on the CPU."""

    def __init__(self, binding: Any, devices: dict[str, str]) -> None:
        self.binding, self._devices = binding, devices

    def bind_input(self, name: str, _device: str, _index: int, *rest: Any) -> None:
        self.binding.bind_input(name, "cpu", 0, *rest)

    def bind_output(self, name: str, device: str = "cpu", _index: int = 0, *rest: Any) -> None:
        self._devices[name] = device
        self.binding.bind_output(name, "cpu", 0, *rest)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.binding, attribute)


class SessionOnADevice:
    """A CPU session whose I/O binding is asked for as a GPU instance's would be."""

    def __init__(self, session: Any) -> None:
        self._session, self.devices = session, dict[str, str]()

    def io_binding(self) -> RecordingBinding:
        return RecordingBinding(self._session.io_binding(), self.devices)

    def run_with_iobinding(self, binding: RecordingBinding, options: Any) -> None:
        self._session.run_with_iobinding(binding.binding, options)


def test_on_a_gpu_bf16_outputs_orts_allocates_are_read_from_host_memory(bf16_file: Path) -> None:
    """``OrtValue.numpy()`` refuses bfloat16 and a device pointer cannot be read on the host:
    BF16 outputs go to host memory, the others stay on the device as before."""
    real = ort.InferenceSession(str(bf16_file), providers=["CPUExecutionProvider"])
    layout = IoLayout.plan(session_signature(real, bf16_file), 8)
    on_device = SessionOnADevice(real)
    runner = BoundRunner(on_device, layout, DeviceLikeMemory(), ort.RunOptions)
    x = np.tile(ODD_BITS, (2, 1))
    y, f = runner.run({"x": x}, ["y", "f"])
    assert on_device.devices == {"y": "cpu", "f": "cuda"}
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(f, x.view(ml_dtypes.bfloat16).astype(np.float32))
