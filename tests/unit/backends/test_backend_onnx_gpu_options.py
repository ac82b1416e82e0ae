"""What a GPU instance tells ONNX Runtime: its own stream, CUDA graphs, a TensorRT EP profile."""

import tempfile
from contextlib import ExitStack
from pathlib import Path

import pytest
from batchserve.backends.onnx_gpu import GpuSetup, graph_hint
from batchserve.backends.onnx_io import HostMemory
from batchserve.backends.onnx_options import (
    CPU_EP,
    CUDA_EP,
    TENSORRT_EP,
    choose_providers,
    tensorrt_profile,
    with_gpu_io,
)
from batchserve.core.device import CPU, Device
from batchserve.core.errors import ModelConfigError
from batchserve.devices.placement import gpu_count
from batchserve.proto.model_config_pb2 import ModelConfig
from google.protobuf import text_format

MODEL = Path("repo/m/1/model.onnx")
GPU0 = Device("gpu", 0)
TRT = text_format.Parse(
    'optimization { execution_accelerators { gpu_execution_accelerator { name: "tensorrt" } } }',
    ModelConfig(name="m"),
)
PROFILE = tensorrt_profile([("image", (3, 32, 32))], 16, (4, 8))


def options(plan_providers: tuple[tuple[str, dict[str, str]], ...]) -> dict[str, dict[str, str]]:
    return dict(plan_providers)


def test_the_instance_stream_goes_to_every_gpu_provider_in_its_own_keys() -> None:
    plan = choose_providers([TENSORRT_EP, CUDA_EP, CPU_EP], TRT, GPU0, model_file=MODEL)
    got = options(with_gpu_io(plan, stream=0x7F00).providers)
    assert got[CUDA_EP]["user_compute_stream"] == str(0x7F00)
    assert got[CUDA_EP]["has_user_compute_stream"] == "1"
    # The TensorRT EP's option parser throws on has_user_compute_stream (it sets the flag
    # itself from user_compute_stream); the contract tests run the real parser.
    assert got[TENSORRT_EP]["user_compute_stream"] == str(0x7F00)
    assert "has_user_compute_stream" not in got[TENSORRT_EP]
    assert got[CPU_EP] == {}


def test_cuda_graphs_go_to_the_cuda_provider_alone_without_tensorrt() -> None:
    plan = choose_providers([CUDA_EP, CPU_EP], ModelConfig(), GPU0, model_file=MODEL)
    got = options(with_gpu_io(plan, cuda_graphs=True).providers)
    assert got[CUDA_EP]["enable_cuda_graph"] == "1"
    assert "user_compute_stream" not in got[CUDA_EP]  # no stream given: ORT picks its own


def test_with_tensorrt_present_no_provider_captures_graphs() -> None:
    # The TensorRT EP holds one graph per session and replays it whatever the shape, and the
    # CUDA EP cannot capture while the TensorRT EP holds nodes.
    plan = choose_providers([TENSORRT_EP, CUDA_EP, CPU_EP], TRT, GPU0, model_file=MODEL)
    got = options(with_gpu_io(plan, cuda_graphs=True).providers)
    assert "trt_cuda_graph_enable" not in got[TENSORRT_EP]
    assert "enable_cuda_graph" not in got[CUDA_EP]


def test_fp32_stays_fp32_and_convolutions_are_not_benchmarked_per_batch_size() -> None:
    plan = choose_providers([CUDA_EP, CPU_EP], ModelConfig(), GPU0, model_file=MODEL)
    got = options(plan.providers)[CUDA_EP]
    assert got["use_tf32"] == "0"
    assert got["cudnn_conv_algo_search"] == "HEURISTIC"


@pytest.mark.parametrize(
    ("params", "search", "tf32"),
    [
        ({"cudnn_conv_algo_search": "0"}, "EXHAUSTIVE", "0"),
        ({"cudnn_conv_algo_search": "2", "use_tf32": "1"}, "DEFAULT", "1"),
        ({"use_tf32": "true"}, "HEURISTIC", "1"),
    ],
)
def test_tritons_cuda_parameters_override_the_defaults(
    params: dict[str, str], search: str, tf32: str
) -> None:
    config = ModelConfig(name="m")
    for key, value in params.items():
        config.parameters[key].string_value = value
    got = options(choose_providers([CUDA_EP, CPU_EP], config, GPU0, model_file=MODEL).providers)
    assert (got[CUDA_EP]["cudnn_conv_algo_search"], got[CUDA_EP]["use_tf32"]) == (search, tf32)


@pytest.mark.parametrize("params", [{"cudnn_conv_algo_search": "HEURISTIC"}, {"use_tf32": "2"}])
def test_a_bad_cuda_parameter_names_itself(params: dict[str, str]) -> None:
    config = ModelConfig(name="m")
    for key, value in params.items():
        config.parameters[key].string_value = value
    with pytest.raises(ModelConfigError, match=next(iter(params))):
        choose_providers([CUDA_EP, CPU_EP], config, GPU0, model_file=MODEL)


def test_the_engine_cache_is_under_the_temporary_directory_not_the_repository() -> None:
    plan = choose_providers([TENSORRT_EP, CUDA_EP, CPU_EP], TRT, GPU0, model_file=MODEL)
    cache = Path(options(plan.providers)[TENSORRT_EP]["trt_engine_cache_path"])
    assert cache == Path(tempfile.gettempdir(), "batchserve-trt-cache", "m", "1")


def test_nothing_changes_without_graphs_stream_or_profile() -> None:
    plan = choose_providers([TENSORRT_EP, CUDA_EP, CPU_EP], TRT, GPU0, model_file=MODEL)
    assert with_gpu_io(plan) == plan


def test_a_cpu_plan_is_left_alone() -> None:
    plan = choose_providers([CPU_EP], ModelConfig(), CPU, model_file=MODEL)
    assert with_gpu_io(plan, stream=1, cuda_graphs=True, tensorrt_profile=PROFILE) == plan


def test_tensorrt_profile_spans_the_batch_range_tuned_for_the_largest_preferred_size() -> None:
    assert PROFILE == {
        "trt_profile_min_shapes": "image:1x3x32x32",
        "trt_profile_opt_shapes": "image:8x3x32x32",
        "trt_profile_max_shapes": "image:16x3x32x32",
    }


def test_tensorrt_profile_lists_every_input_and_defaults_opt_to_the_max() -> None:
    got = tensorrt_profile([("tokens", (64,)), ("mask", (64,))], 32, ())
    assert got["trt_profile_opt_shapes"] == "tokens:32x64,mask:32x64"


@pytest.mark.parametrize(
    ("inputs", "cap"), [([("x", (4,))], 0), ([], 8)], ids=["no batch axis", "no inputs"]
)
def test_no_tensorrt_profile_without_a_batch_axis_or_inputs(
    inputs: list[tuple[str, tuple[int, ...]]], cap: int
) -> None:
    assert tensorrt_profile(inputs, cap, (4,)) == {}


def test_the_profile_reaches_the_tensorrt_provider_only() -> None:
    plan = choose_providers([TENSORRT_EP, CUDA_EP, CPU_EP], TRT, GPU0, model_file=MODEL)
    got = options(with_gpu_io(plan, tensorrt_profile=PROFILE).providers)
    assert got[TENSORRT_EP]["trt_profile_opt_shapes"] == "image:8x3x32x32"
    assert not any(key.startswith("trt_profile") for key in got[CUDA_EP])


def test_a_profile_set_in_the_accelerator_parameters_wins() -> None:
    config = text_format.Parse(
        'optimization { execution_accelerators { gpu_execution_accelerator { name: "tensorrt" '
        'parameters { key: "trt_profile_min_shapes" value: "image:2x3x32x32" } } } }',
        ModelConfig(name="m"),
    )
    plan = choose_providers([TENSORRT_EP, CUDA_EP, CPU_EP], config, GPU0, model_file=MODEL)
    got = options(with_gpu_io(plan, tensorrt_profile=PROFILE).providers)[TENSORRT_EP]
    assert got["trt_profile_min_shapes"] == "image:2x3x32x32"
    assert "trt_profile_opt_shapes" not in got  # never half of one profile and half of another


# --- The GPU setup as it runs on a machine without an NVIDIA driver -------------------------

GRAPHS = text_format.Parse(
    "max_batch_size: 16 dynamic_batching { preferred_batch_size: [4, 8] } "
    "optimization { cuda { graphs: true } "
    'execution_accelerators { gpu_execution_accelerator { name: "tensorrt" } } }',
    ModelConfig(name="m"),
)


@pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU")
def test_without_a_driver_the_setup_keeps_going_for_the_session_to_report(mlp_file: Path) -> None:
    plan = choose_providers([TENSORRT_EP, CUDA_EP, CPU_EP], GRAPHS, GPU0, model_file=mlp_file)
    with ExitStack() as rollback:
        setup = GpuSetup.open(plan, GRAPHS, mlp_file, True, rollback)
    assert isinstance(setup.memory, HostMemory)
    assert setup.graph_sizes == ()  # the TensorRT EP is in the plan: no ORT graphs
    assert any("holds one CUDA graph per session" in w for w in setup.warnings)
    assert any("no CUDA stream on gpu:0: cudaSetDevice failed" in w for w in setup.warnings)
    got = options(setup.plan.providers)
    assert "trt_cuda_graph_enable" not in got[TENSORRT_EP]
    assert "user_compute_stream" not in got[CUDA_EP]
    # the TensorRT EP profile comes from the model file and the preferred sizes
    assert got[TENSORRT_EP]["trt_profile_opt_shapes"] == "x:8x8"
    assert got[TENSORRT_EP]["trt_profile_max_shapes"] == "x:16x8"


def test_graphs_for_a_model_with_a_sequence_axis_are_refused_with_a_warning(
    sequence_file: Path,
) -> None:
    plan = choose_providers([CUDA_EP, CPU_EP], GRAPHS, GPU0, model_file=sequence_file)
    with ExitStack() as rollback:
        setup = GpuSetup.open(plan, GRAPHS, sequence_file, True, rollback)
    assert setup.graph_sizes == ()
    assert any(
        "every input and output fixed apart from the batch axis" in w for w in setup.warnings
    )
    assert "enable_cuda_graph" not in options(setup.plan.providers)[CUDA_EP]


def test_a_cpu_instance_asked_for_graphs_gets_a_warning_and_no_gpu_options(mlp_file: Path) -> None:
    plan = choose_providers([CPU_EP], GRAPHS, CPU, model_file=mlp_file)
    with ExitStack() as rollback:
        setup = GpuSetup.open(plan, GRAPHS, mlp_file, True, rollback)
    assert setup.plan == plan
    assert setup.warnings == (f"{mlp_file}: optimization.cuda.graphs is ignored on the CPU",)


@pytest.mark.parametrize(
    ("sizes", "message", "hinted"),
    [
        ((4,), "m.onnx: This session cannot use the graph capture feature as requested", True),
        ((4,), "m.onnx: Load model failed: bad protobuf", False),
        ((), "m.onnx: This session cannot use the graph capture feature as requested", False),
    ],
)
def test_a_refused_graph_capture_says_how_to_go_on(
    sizes: tuple[int, ...], message: str, hinted: bool
) -> None:
    with pytest.raises(ModelConfigError) as caught, graph_hint(sizes, MODEL):
        raise ModelConfigError(message)
    hint = "set optimization { cuda { graphs: false } } in repo/m/config.pbtxt"
    assert caught.value.message.startswith(message)
    assert (hint in caught.value.message) is hinted
