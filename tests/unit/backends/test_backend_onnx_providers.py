import logging
import os
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest
from batchserve.backends.onnx_options import (
    CPU_EP,
    CUDA_EP,
    TENSORRT_EP,
    choose_providers,
    default_engine_cache,
    session_options,
)
from batchserve.core.cpu_budget import declare_cpus, runtime_threads
from batchserve.core.device import CPU, Device
from batchserve.core.errors import DeviceUnavailable, ModelConfigError
from batchserve.proto.model_config_pb2 import ModelConfig
from batchserve.runtime.in_process import Server
from google.protobuf import text_format

from bench.common import running_on

MODEL = Path("repo/m/1/model.onnx")
CPU_ONLY = ["AzureExecutionProvider", CPU_EP]
WITH_CUDA = [CUDA_EP, CPU_EP]
WITH_TRT = [TENSORRT_EP, CUDA_EP, CPU_EP]
GPU1 = Device("gpu", 1)


def pbtxt(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig(name="m"))


TRT_FP16 = pbtxt("""
optimization { execution_accelerators { gpu_execution_accelerator {
  name: "tensorrt"
  parameters { key: "precision_mode" value: "FP16" }
  parameters { key: "max_workspace_size_bytes" value: "1073741824" }
  parameters { key: "trt_min_subgraph_size" value: "3" }
} } }
""")
FALLBACK = pbtxt("batchserve { allow_cpu_fallback: true }")


def names(plan_providers: tuple[tuple[str, dict[str, str]], ...]) -> list[str]:
    return [name for name, _ in plan_providers]


def test_cpu_device_gets_the_cpu_provider_only():
    plan = choose_providers(CPU_ONLY, ModelConfig(), CPU, model_file=MODEL)
    assert plan.providers == ((CPU_EP, {}),)
    assert plan.device == CPU
    assert plan.warnings == ()


def test_gpu_device_with_cuda_gets_cuda_then_cpu():
    plan = choose_providers(WITH_TRT, ModelConfig(), GPU1, model_file=MODEL)
    assert names(plan.providers) == [CUDA_EP, CPU_EP]
    assert plan.device == GPU1
    cuda = plan.providers[0][1]
    assert cuda["device_id"] == "1"
    assert cuda["arena_extend_strategy"] == "kSameAsRequested"
    assert cuda["do_copy_in_default_stream"] == "True"
    assert "gpu_mem_limit" not in cuda


def test_memory_limit_becomes_gpu_mem_limit():
    plan = choose_providers(WITH_CUDA, ModelConfig(), GPU1, model_file=MODEL, memory_limit_bytes=7)
    assert plan.providers[0][1]["gpu_mem_limit"] == "7"


def test_tensorrt_requested_and_available_comes_first():
    plan = choose_providers(WITH_TRT, TRT_FP16, GPU1, model_file=MODEL)
    assert names(plan.providers) == [TENSORRT_EP, CUDA_EP, CPU_EP]
    trt = plan.providers[0][1]
    assert trt["device_id"] == "1"
    assert trt["trt_fp16_enable"] == "True"
    assert trt["trt_max_workspace_size"] == "1073741824"
    assert trt["trt_min_subgraph_size"] == "3"
    assert trt["trt_engine_cache_enable"] == "True"
    assert trt["trt_engine_cache_path"] == str(default_engine_cache(MODEL))


def test_tensorrt_requested_but_absent_warns_and_uses_cuda():
    plan = choose_providers(WITH_CUDA, TRT_FP16, Device("gpu", 0), model_file=MODEL)
    assert names(plan.providers) == [CUDA_EP, CPU_EP]
    assert TENSORRT_EP in plan.warnings[0]


def test_tensorrt_not_requested_is_not_used():
    assert TENSORRT_EP not in names(
        choose_providers(WITH_TRT, ModelConfig(), GPU1, model_file=MODEL).providers
    )


@pytest.mark.parametrize(
    ("parameter", "match"),
    [
        ('key: "precision_mode" value: "FP8"', "precision_mode='FP8'"),
        ('key: "workspace" value: "1"', "workspace='1'"),
    ],
)
def test_bad_tensorrt_parameters_are_config_errors(parameter: str, match: str):
    config = pbtxt(
        "optimization { execution_accelerators { gpu_execution_accelerator {"
        f' name: "tensorrt" parameters {{ {parameter} }} }} }} }}'
    )
    with pytest.raises(ModelConfigError, match=match):
        choose_providers(WITH_TRT, config, GPU1, model_file=MODEL)


def test_cuda_accelerator_parameters_override_the_defaults():
    config = pbtxt("""
    optimization { execution_accelerators { gpu_execution_accelerator {
      name: "cuda"
      parameters { key: "cudnn_conv_use_max_workspace" value: "0" }
      parameters { key: "arena_extend_strategy" value: "kNextPowerOfTwo" }
    } } }
    """)
    cuda = choose_providers(WITH_CUDA, config, GPU1, model_file=MODEL).providers[0][1]
    assert cuda["cudnn_conv_use_max_workspace"] == "0"
    assert cuda["arena_extend_strategy"] == "kNextPowerOfTwo"


def test_unknown_gpu_accelerator_is_a_config_error():
    config = pbtxt(
        'optimization { execution_accelerators { gpu_execution_accelerator { name: "tpu" } } }'
    )
    with pytest.raises(
        ModelConfigError, match=r"model\.onnx: unknown gpu_execution_accelerator 'tpu'"
    ):
        choose_providers(WITH_CUDA, config, GPU1, model_file=MODEL)


def test_gpu_without_cuda_provider_refused_names_file_providers_and_fix():
    with pytest.raises(DeviceUnavailable) as caught:
        choose_providers(CPU_ONLY, ModelConfig(), GPU1, model_file=MODEL)
    message = str(caught.value)
    assert str(MODEL) in message
    assert "gpu:1" in message
    assert "AzureExecutionProvider, CPUExecutionProvider" in message
    assert "pip install 'batchserve[gpu]'" in message
    assert "NVIDIA driver" in message


def test_gpu_without_cuda_provider_falls_back_when_allowed():
    plan = choose_providers(CPU_ONLY, FALLBACK, GPU1, model_file=MODEL, memory_limit_bytes=9)
    assert plan.providers == ((CPU_EP, {}),)
    assert plan.device == CPU
    assert "running on the CPU" in plan.warnings[0]


def test_cpu_accelerators_are_used_when_the_wheel_offers_them():
    config = pbtxt("""
    optimization { execution_accelerators { cpu_execution_accelerator {
      name: "openvino" parameters { key: "device_type" value: "CPU" }
    } } }
    """)
    offered = choose_providers(["OpenVINOExecutionProvider", CPU_EP], config, CPU, model_file=MODEL)
    assert offered.providers == (
        ("OpenVINOExecutionProvider", {"device_type": "CPU"}),
        (CPU_EP, {}),
    )
    absent = choose_providers(CPU_ONLY, config, CPU, model_file=MODEL)
    assert absent.providers == ((CPU_EP, {}),)
    assert "OpenVINOExecutionProvider" in absent.warnings[0]


def test_unknown_cpu_accelerator_is_a_config_error():
    config = pbtxt(
        'optimization { execution_accelerators { cpu_execution_accelerator { name: "fpga" } } }'
    )
    with pytest.raises(
        ModelConfigError, match=r"unknown cpu_execution_accelerator 'fpga'.*openvino"
    ):
        choose_providers(CPU_ONLY, config, CPU, model_file=MODEL)


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (None, ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
        (-1, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC),
        (1, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
        (2, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
    ],
)
def test_graph_level_follows_triton(level: int | None, expected: object):
    config = pbtxt("" if level is None else f"optimization {{ graph {{ level: {level} }} }}")
    assert session_options(config, MODEL).graph_optimization_level == expected


def test_another_graph_level_turns_every_optimization_on_as_in_triton(
    caplog: pytest.LogCaptureFixture,
):
    """Triton's ONNX Runtime backend reads any other level as 0; it used to be refused."""
    config = pbtxt("optimization { graph { level: 7 } }")
    level = session_options(config, MODEL).graph_optimization_level
    assert level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert "optimization.graph.level 7 is not one of -1, 0, 1, 2" in caplog.text


def test_parameters_set_threads_mode_and_memory_pattern():
    config = pbtxt("""
    parameters { key: "intra_op_thread_count" value { string_value: "2" } }
    parameters { key: "inter_op_thread_count" value { string_value: "1" } }
    parameters { key: "execution_mode" value { string_value: "1" } }
    parameters { key: "enable_mem_pattern" value { string_value: "0" } }
    parameters { key: "allow_spinning" value { string_value: "1" } }
    parameters { key: "unrelated_setting" value { string_value: "x" } }
    """)
    options = session_options(config, MODEL)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert options.intra_op_num_threads == 2
    assert options.inter_op_num_threads == 1
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.enable_mem_pattern is False
    assert options.enable_cpu_mem_arena is True


ASKED_FOR_PATTERN = 'parameters { key: "enable_mem_pattern" value: { string_value: "1" } }'


@pytest.mark.parametrize(
    ("config", "pattern"),
    [
        ("max_batch_size: 8 input [{ name: 'x' data_type: TYPE_FP32 dims: [4] }]", False),
        ("input [{ name: 'x' data_type: TYPE_FP32 dims: [3, -1, -1] }]", False),
        ("input [{ name: 'x' data_type: TYPE_FP32 dims: [3, 8, 8] }]", True),
        (f"max_batch_size: 8 {ASKED_FOR_PATTERN}", True),
    ],
    ids=["batch-axis", "free-axes", "fixed-shapes", "asked-for"],
)
def test_the_memory_pattern_is_on_by_default_only_for_fixed_shapes(
    config: str, pattern: bool
) -> None:
    assert session_options(pbtxt(config), MODEL).enable_mem_pattern is pattern


def test_threads_left_to_the_runtime_are_one_per_core_this_process_may_use():
    options = session_options(ModelConfig(name="m"), MODEL)
    assert options.intra_op_num_threads == runtime_threads()
    assert options.inter_op_num_threads == runtime_threads()
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.enable_mem_pattern is True
    assert options.logid == "m"
    # threads wait without spinning, so idle instances leave the cores to the event loop
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"


def test_a_server_given_cpus_gives_its_sessions_no_more_threads(tmp_path: Path) -> None:
    """The in-process server with ``cpus=1``, as the ``serve`` command with ``--cpus 1``."""
    try:
        Server(model_repository=tmp_path, cpus=1)
        options = session_options(ModelConfig(name="m"), MODEL)
        assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)
        host = os.cpu_count() or 1
        named = f'parameters {{ key: "intra_op_thread_count" value {{ string_value: "{host}" }} }}'
        set_by_config = session_options(pbtxt(named), MODEL)
        assert set_by_config.intra_op_num_threads == host  # a count named is not bounded by it
    finally:
        declare_cpus(None)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("intra_op_thread_count", "two"),
        ("inter_op_thread_count", "1.5"),
        ("enable_mem_pattern", "yes"),
    ],
)
def test_bad_parameters_name_themselves(key: str, value: str):
    config = pbtxt(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
    with pytest.raises(ModelConfigError, match=rf"model\.onnx: parameter {key}='{value}'"):
        session_options(config, MODEL)


def test_thread_counts_are_read_as_triton_reads_them_and_bounded_by_the_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Zero or less leaves the pool to the server's choice, as Triton leaves it to ORT; a
    count above the host's CPUs is lowered to them (with 100000 a session had not loaded after
    two minutes)."""

    def threads(intra: str, inter: str) -> tuple[int, int]:
        named = " ".join(
            f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}'
            for key, value in (("intra_op_thread_count", intra), ("inter_op_thread_count", inter))
        )
        options = session_options(pbtxt(named), MODEL)
        return options.intra_op_num_threads, options.inter_op_num_threads

    host = os.cpu_count() or 1
    assert threads("-1", "0") == (runtime_threads(), runtime_threads())
    assert threads(" 1 ", str(host)) == (1, host)
    with caplog.at_level(logging.WARNING):
        assert threads("100000", "1") == (host, 1)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        f"intra_op_thread_count=100000 is more threads than this machine's {host} CPUs" in warning
    )


def test_tritons_boolean_spellings_reach_the_tensorrt_provider_as_it_spells_them() -> None:
    config = pbtxt(
        'optimization { execution_accelerators { gpu_execution_accelerator { name: "tensorrt" '
        'parameters { key: "trt_engine_cache_enable" value: "1" } '
        'parameters { key: "trt_timing_cache_enable" value: "true" } '
        'parameters { key: "trt_force_sequential_engine_build" value: "0" } '
        'parameters { key: "trt_builder_optimization_level" value: "1" } } } }'
    )
    trt = dict(choose_providers(WITH_TRT, config, GPU1, model_file=MODEL).providers)[TENSORRT_EP]
    assert trt["trt_engine_cache_enable"] == "True"
    assert trt["trt_timing_cache_enable"] == "True"
    assert trt["trt_force_sequential_engine_build"] == "False"
    assert trt["trt_builder_optimization_level"] == "1"  # a number, left alone


THREADS_OF_A_SESSION = """
import os, sys
from pathlib import Path
import numpy as np
import onnxruntime as ort
from batchserve.backends.onnx_options import session_options
from batchserve.proto.model_config_pb2 import ModelConfig
model = Path(sys.argv[1])
session = ort.InferenceSession(str(model), session_options(ModelConfig(name="m"), model),
                               providers=["CPUExecutionProvider"])
session.run(None, {"image": np.zeros((8, 1, 8, 8), np.float32)})
for task in Path("/proc/self/task").iterdir():
    print(os.sched_getaffinity(int(task.name)))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a CPU to leave out")
def test_a_session_under_a_one_cpu_affinity_keeps_every_thread_on_that_cpu(tmp_path: Path):
    """Left to choose, ONNX Runtime (1.32) sized its pool by the host's cores and pinned a
    thread to the CPU this process was not given; the count the server sets pins nothing."""
    model = Path(__file__).resolve().parents[3] / "model_repo" / "digits_cnn" / "1" / "model.onnx"
    chosen = {min(os.sched_getaffinity(0))}
    with running_on(chosen):
        found = subprocess.run(
            [sys.executable, "-c", THREADS_OF_A_SESSION, str(model)],
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout.split("\n")  # fmt: skip
    affinities = [line for line in found if line]
    assert affinities
    assert set(affinities) == {str(chosen)}
