import logging

import pytest
from batchserve.core.device import CPU, Device
from batchserve.core.errors import DeviceUnavailable, ModelConfigError
from batchserve.devices.placement import resolve_devices
from batchserve.proto.model_config_pb2 import ModelConfig
from google.protobuf import text_format


def config(text: str = "") -> ModelConfig:
    return text_format.Parse(text, ModelConfig(name="m"))


def gpus(*indices: int) -> list[Device]:
    return [Device("gpu", i) for i in indices]


@pytest.mark.parametrize(
    ("available", "expected"),
    [(0, [CPU]), (1, gpus(0)), (2, gpus(0, 1))],
)
def test_no_instance_group_means_one_per_gpu_else_one_cpu(available: int, expected: list[Device]):
    assert resolve_devices(config(), available) == expected


@pytest.mark.parametrize(
    ("group", "available", "expected"),
    [
        ("count: 2", 2, gpus(0, 0, 1, 1)),
        ("count: 2 gpus: [1]", 2, gpus(1, 1)),
        ("count: 2 gpus: [3]", 2, [CPU, CPU]),
        ("count: 3", 0, [CPU, CPU, CPU]),
        ("", 0, [CPU]),
    ],
)
def test_kind_auto_uses_gpus_only_when_every_listed_one_exists(
    group: str, available: int, expected: list[Device]
):
    assert resolve_devices(config(f"instance_group {{ kind: KIND_AUTO {group} }}"), available) == (
        expected
    )


@pytest.mark.parametrize(
    ("group", "available", "expected"),
    [
        ("count: 1", 2, gpus(0, 1)),
        ("count: 2 gpus: [1, 0]", 2, gpus(1, 1, 0, 0)),
        ("gpus: [0]", 4, gpus(0)),
    ],
)
def test_kind_gpu_places_count_instances_on_each_gpu(
    group: str, available: int, expected: list[Device]
):
    assert resolve_devices(config(f"instance_group {{ kind: KIND_GPU {group} }}"), available) == (
        expected
    )


def test_kind_gpu_without_a_gpu_is_device_unavailable():
    with pytest.raises(DeviceUnavailable) as caught:
        resolve_devices(config("instance_group { name: 'fast' kind: KIND_GPU count: 2 }"), 0)
    message = str(caught.value)
    assert "model 'm' instance_group 'fast' asks for a GPU" in message
    assert "has 0 GPU(s)" in message
    assert "allow_cpu_fallback" in message


def test_kind_gpu_listing_an_absent_gpu_names_it():
    with pytest.raises(DeviceUnavailable, match=r"asks for GPUs \[5\].*has 2 GPU"):
        resolve_devices(config("instance_group { kind: KIND_GPU gpus: [0, 5] }"), 2)


def test_kind_gpu_falls_back_to_cpu_when_allowed(caplog: pytest.LogCaptureFixture):
    allowed = config(
        "instance_group { kind: KIND_GPU count: 2 gpus: [0, 1] } "
        "batchserve { allow_cpu_fallback: true }"
    )
    with caplog.at_level(logging.WARNING, logger="batchserve.devices.placement"):
        assert resolve_devices(allowed, 0) == [CPU] * 4
    assert "running its instances on the CPU" in caplog.text


def test_kind_cpu_places_count_cpu_instances_even_with_gpus():
    assert resolve_devices(config("instance_group { kind: KIND_CPU count: 3 }"), 2) == [CPU] * 3


def test_groups_are_concatenated_in_order():
    two_groups = config(
        "instance_group { kind: KIND_GPU gpus: [1] } instance_group { kind: KIND_CPU count: 2 }"
    )
    assert resolve_devices(two_groups, 2) == [Device("gpu", 1), CPU, CPU]


@pytest.mark.parametrize(
    ("group", "match"),
    [
        ("kind: KIND_CPU gpus: [0]", "KIND_CPU cannot list gpus"),
        ("kind: KIND_MODEL", "KIND_MODEL is not supported"),
        ("kind: KIND_GPU count: -1", "count -1 is negative"),
        ("kind: KIND_GPU gpus: [-1]", "negative index"),
    ],
)
def test_invalid_groups_are_config_errors(group: str, match: str):
    with pytest.raises(ModelConfigError, match=f"model 'm' instance_group '0': .*{match}"):
        resolve_devices(config(f"instance_group {{ {group} }}"), 1)


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ("", [CPU]),
        ("instance_group { kind: KIND_AUTO count: 2 }", [CPU, CPU]),
        ("instance_group { kind: KIND_GPU gpus: [1] }", gpus(1)),
        (
            "instance_group { kind: KIND_AUTO } instance_group { kind: KIND_GPU gpus: [0] }",
            [CPU, Device("gpu", 0)],
        ),
    ],
)
def test_a_runtime_without_gpu_support_leaves_only_the_servers_choice_to_the_cpu(
    groups: str, expected: list[Device]
):
    assert resolve_devices(config(groups), 2, auto_gpu=False) == expected


TRITON_GPU_ID = (
    "instance group {group} of model {model} specifies invalid or unsupported gpu id {gpu}. "
    "GPUs with at least the minimum required CUDA compute compatibility"
)
"""Triton's words (its ValidateInstanceGroup), as its L0_model_config reads them."""


def test_a_gpu_id_the_machine_lacks_is_refused_in_tritons_words_first():
    """Triton's L0_model_config ``invalid_gpu`` and ``negative_gpu``: an unnamed group is
    named ``<model>_<position>``; the GPUs present follow, then batchserve's account."""
    absent = ModelConfig()
    text_format.Parse('name: "invalid_gpu" instance_group { kind: KIND_GPU gpus: [ 42 ] }', absent)
    with pytest.raises(DeviceUnavailable) as caught:
        resolve_devices(absent, 2)
    message = str(caught.value)
    assert message.startswith(
        TRITON_GPU_ID.format(group="invalid_gpu_0", model="invalid_gpu", gpu=42)
    )
    assert "(batchserve sets none) are: 0, 1 (batchserve: " in message
    assert "asks for GPUs [42], but this machine has 2 GPU(s)" in message
    negative = ModelConfig()
    text_format.Parse(
        'name: "negative_gpu" instance_group { gpus: [ 0 ] } '
        "instance_group { kind: KIND_GPU gpus: [ -1 ] }",
        negative,
    )
    with pytest.raises(ModelConfigError) as refused:
        resolve_devices(negative, 1)
    assert str(refused.value).startswith(
        TRITON_GPU_ID.format(group="negative_gpu_1", model="negative_gpu", gpu=-1)
    )


def test_kind_gpu_with_no_gpu_present_is_refused_in_tritons_words_first():
    with pytest.raises(DeviceUnavailable) as caught:
        resolve_devices(config("instance_group { name: 'fast' kind: KIND_GPU }"), 0)
    assert str(caught.value).startswith(
        "instance group fast of model m has kind KIND_GPU but no GPUs are available (batchserve: "
    )
