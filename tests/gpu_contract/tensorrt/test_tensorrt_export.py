"""``batchserve export --tensorrt`` builds its engine with calls this TensorRT major has.

The builder, network, parser and builder config are checked fakes of TensorRT's own classes
(``pybind_fakes``), so a member this major removed (TensorRT 11 dropped ``BuilderFlag.FP16``)
or a call that fits no signature fails the build here as it would on a GPU. The parser records
the ONNX graph it is given, which shows in what precision the engine would compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import onnx
import pytest
from batchserve.export.spec import ExportSpec, ServingOptions, parse_input_spec
from batchserve.export.tensorrt import TensorRTOptions, build_engine
from onnx import TensorProto

from tests.gpu_contract.models import write_mlp
from tests.gpu_contract.pybind_fakes import FakeFactory

PLAN = b"serialised engine"
SPEC = ExportSpec(
    "mlp",
    (parse_input_spec("x:FP32:batch,8"),),
    outputs=("y",),
    max_batch_size=16,
    batch_sizes=(1, 4, 16),
    serving=ServingOptions(dynamic_batching=True, preferred_batch_sizes=(4,)),
)
# One profile per preferred size, then one up to max_batch_size: (min, opt, max) of x.
PROFILES = [((1, 8), (4, 8), (4, 8)), ((5, 8), (16, 8), (16, 8))]


@dataclass
class Build:
    """The fakes of one build and what they were given."""

    builder: Any = None
    config: Any = None
    profiles: list[Any] = field(default_factory=list)
    parsed: list[onnx.ModelProto] = field(default_factory=list)


@pytest.fixture
def build(trt: ModuleType, fakes: FakeFactory, monkeypatch: pytest.MonkeyPatch) -> Build:
    made = Build()

    def profile() -> Any:
        made.profiles.append(fakes.fake(trt.IOptimizationProfile))
        return made.profiles[-1]

    made.config = fakes.fake(
        trt.IBuilderConfig, add_optimization_profile=lambda p: made.profiles.index(p)
    )
    made.builder = fakes.fake(
        trt.Builder,
        create_network=lambda flags=0: fakes.fake(trt.INetworkDefinition),
        create_builder_config=made.config,
        create_optimization_profile=profile,
        build_serialized_network=lambda network, config: PLAN,
    )

    def parse_from_file(model: str) -> bool:
        made.parsed.append(onnx.load(model))
        return True

    def parse(model: Any, path: str | None = None) -> bool:
        made.parsed.append(onnx.load_from_string(bytes(model)))
        return True

    parser_class = trt.OnnxParser

    def parser(network: Any, logger: Any) -> Any:
        return fakes.fake(parser_class, parse_from_file=parse_from_file, parse=parse, num_errors=0)

    monkeypatch.setattr(trt, "Builder", fakes.constructor(trt.Builder, lambda logger: made.builder))
    monkeypatch.setattr(trt, "OnnxParser", fakes.constructor(parser_class, parser))
    return made


def float_types(model: onnx.ModelProto) -> set[int]:
    """Element types of the graph's weights and of the casts it makes."""
    types = {tensor.data_type for tensor in model.graph.initializer}
    for node in model.graph.node:
        types |= {a.i for a in node.attribute if node.op_type == "Cast" and a.name == "to"}
    return types & {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}


def flags_set(build: Build) -> list[str]:
    return [call.args[0].name for call in build.config.set_flag.call_args_list]


def run_build(tmp_path: Path, options: TensorRTOptions) -> Path:
    onnx_file = write_mlp(tmp_path / "staged" / "model.onnx")
    plan = tmp_path / "staged" / "model.plan"
    build_engine(onnx_file, SPEC, options, plan)
    return plan


def test_fp32_build_parses_the_graph_and_sets_profiles_and_workspace(
    build: Build, trt: ModuleType, tmp_path: Path
) -> None:
    plan = run_build(tmp_path, TensorRTOptions(workspace_mib=256))
    assert plan.read_bytes() == PLAN
    shapes = [call.args for p in build.profiles for call in p.set_shape.call_args_list]
    assert shapes == [("x", *profile) for profile in PROFILES]
    assert build.config.add_optimization_profile.call_count == len(PROFILES)
    pool = build.config.set_memory_pool_limit.call_args
    assert pool.args == (trt.MemoryPoolType.WORKSPACE, 256 << 20)
    # FP32 stays FP32: TF32 (on by default) is cleared, nothing lowers the precision.
    cleared = [call.args[0] for call in build.config.clear_flag.call_args_list]
    assert trt.BuilderFlag.TF32 in cleared
    assert "FP16" not in flags_set(build)
    assert [float_types(model) for model in build.parsed] == [{TensorProto.FLOAT}]


def test_fp16_build_completes_and_computes_in_fp16(build: Build, tmp_path: Path) -> None:
    """On TensorRT 11, which has no precision flags, only an FP16-typed graph can do it."""
    plan = run_build(tmp_path, TensorRTOptions(fp16=True))
    assert plan.read_bytes() == PLAN
    (model,) = build.parsed
    fp16_graph = TensorProto.FLOAT16 in float_types(model)
    assert fp16_graph or "FP16" in flags_set(build), "nothing asks TensorRT for FP16"
