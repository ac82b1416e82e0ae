"""Where a version's instances go on a GPU machine whose runtime cannot use the GPU.

The runtimes are the real ones installed here (the CPU build of onnxruntime, the CPU build
of torch), so what they report is what a CUDA host with those wheels reports; only the GPU
count is the machine's to give, and this machine has none.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from batchserve.backends.selection import gpu_unusable
from batchserve.core.device import CPU, Device
from batchserve.core.errors import DeviceUnavailable
from batchserve.devices.placement import Placement, group_signature
from batchserve.models import placing
from batchserve.models.model_config import parse_pbtxt
from batchserve.proto.model_config_pb2 import ModelInstanceGroup

ONNX = Path("model.onnx")


def _on_a_gpu_machine(monkeypatch: pytest.MonkeyPatch, gpus: int = 1) -> None:
    monkeypatch.setattr(placing, "gpu_count", lambda: gpus)


def test_cpu_onnxruntime_says_it_cannot_use_a_gpu() -> None:
    assert "has no CUDAExecutionProvider" in gpu_unusable(parse_pbtxt('name: "m"'), ONNX)


def test_cpu_torch_says_it_cannot_use_a_gpu() -> None:
    pytest.importorskip("torch")
    reason = gpu_unusable(parse_pbtxt('name: "m"'), Path("model.pt2"))
    assert "CPU-only build" in reason


def test_tensorrt_always_can() -> None:
    assert gpu_unusable(parse_pbtxt('name: "m"'), Path("model.plan")) == ""


def test_an_onnx_model_left_to_the_server_runs_on_the_cpu_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _on_a_gpu_machine(monkeypatch, gpus=2)
    with caplog.at_level(logging.WARNING, logger="batchserve.models.placing"):
        found = placing.placements(parse_pbtxt('name: "m"'), ONNX)
    assert [p.device for p in found] == [CPU]
    assert "model 'm'" in caplog.text
    assert "has 2 GPU(s)" in caplog.text
    assert "CUDAExecutionProvider" in caplog.text


def test_a_gpu_asked_for_by_name_stays_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """KIND_GPU is the user's choice: the model is not moved silently; its load then fails
    (or falls back, where allowed) saying why."""
    _on_a_gpu_machine(monkeypatch)
    config = parse_pbtxt('name: "m" instance_group { kind: KIND_GPU }')
    assert [p.device for p in placing.placements(config, ONNX)] == [Device("gpu", 0)]


def test_a_tensorrt_plan_left_to_the_server_goes_to_the_gpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _on_a_gpu_machine(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="batchserve.models.placing"):
        found = placing.placements(parse_pbtxt('name: "m"'), Path("model.plan"))
    assert [p.device for p in found] == [Device("gpu", 0)]
    assert caplog.text == ""


def test_without_a_gpu_nothing_is_asked_of_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    _on_a_gpu_machine(monkeypatch, gpus=0)
    with pytest.raises(DeviceUnavailable, match="has 0 GPU"):
        placing.placements(parse_pbtxt('name: "m" instance_group { kind: KIND_GPU }'), ONNX)


def _placed(config_text: str, devices: list[Device]) -> list[Placement]:
    """Every group's placement key with ``devices`` in turn, one device per group."""
    config = parse_pbtxt(config_text)
    keys = [group_signature(group) for group in config.instance_group]
    return [Placement(device, key) for device, key in zip(devices, keys, strict=True)]


def test_a_served_config_shows_kind_auto_as_the_kind_its_instances_got() -> None:
    text = (
        'name: "m" instance_group [ { name: "a" }, { name: "b" gpus: [ 3 ] }, '
        '{ name: "c" kind: KIND_GPU }, { name: "d" kind: KIND_CPU }, { name: "e" gpus: [ 7 ] } ]'
    )
    config = parse_pbtxt(text)
    placed = _placed(text, [CPU, Device("gpu", 3), Device("gpu", 1), CPU, CPU])
    shown = placing.as_placed(config, placed)
    assert [(g.name, g.kind, list(g.gpus)) for g in shown.instance_group] == [
        ("a", ModelInstanceGroup.KIND_CPU, []),
        ("b", ModelInstanceGroup.KIND_GPU, [3]),
        ("c", ModelInstanceGroup.KIND_GPU, [1]),  # Triton lists the GPUs of a group that named none
        ("d", ModelInstanceGroup.KIND_CPU, []),
        ("e", ModelInstanceGroup.KIND_CPU, []),  # its GPU is missing: placed on the CPU
    ]
    assert config == parse_pbtxt(text)  # the written config is kept: reloads compare it


def test_a_gpu_group_whose_instances_fell_back_to_the_cpu_is_shown_on_the_cpu() -> None:
    """Its runtime could not use the GPU (an ONNX Runtime without CUDA, where falling back is
    allowed): the config a client reads says where it runs."""
    text = (
        'name: "m" instance_group [ { name: "g" kind: KIND_GPU gpus: [ 0 ] }, '
        '{ name: "h" kind: KIND_GPU } ]'
    )
    shown = placing.as_placed(parse_pbtxt(text), _placed(text, [CPU, Device("gpu", 1)]))
    assert [(g.name, g.kind, list(g.gpus)) for g in shown.instance_group] == [
        ("g", ModelInstanceGroup.KIND_CPU, []),
        ("h", ModelInstanceGroup.KIND_GPU, [1]),
    ]


def test_a_group_with_no_instance_loaded_is_shown_as_written() -> None:
    config = parse_pbtxt('name: "m" instance_group [ { name: "a" } ]')
    assert placing.as_placed(config, []) == config
