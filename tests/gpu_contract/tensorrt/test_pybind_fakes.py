"""The checked fakes refuse what real TensorRT objects refuse, and accept what they accept."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.gpu_contract.pybind_fakes import ApiMismatch, FakeFactory, signatures


def test_a_misspelled_method_is_refused(trt: ModuleType, fakes: FakeFactory) -> None:
    engine = fakes.fake(trt.ICudaEngine)
    with pytest.raises(AttributeError):
        engine.get_tensor_shapes("x")


def test_a_misspelled_answer_is_refused(trt: ModuleType, fakes: FakeFactory) -> None:
    with pytest.raises(AttributeError, match="num_io_tensor"):
        fakes.fake(trt.ICudaEngine, num_io_tensor=2)


@pytest.mark.parametrize(
    "args", [(), ("x", 0), ("x", "y")], ids=["too few", "too many", "overload arity"]
)
def test_a_wrong_argument_count_is_refused(
    trt: ModuleType, fakes: FakeFactory, args: tuple[object, ...]
) -> None:
    context = fakes.fake(trt.IExecutionContext, get_tensor_shape=trt.Dims((1,)))
    with pytest.raises(ApiMismatch, match="matches none of"):
        context.get_tensor_shape(*args)


def test_a_wrong_argument_type_or_keyword_is_refused(trt: ModuleType, fakes: FakeFactory) -> None:
    context = fakes.fake(trt.IExecutionContext, set_input_shape=True, set_tensor_address=True)
    with pytest.raises(ApiMismatch):
        context.set_tensor_address("x", "0x1000")
    with pytest.raises(ApiMismatch):
        context.set_input_shape("x", 8)
    with pytest.raises(ApiMismatch):
        context.set_tensor_address(name="x", address=4096)


def test_pybinds_conversions_and_overloads_are_accepted(
    trt: ModuleType, fakes: FakeFactory
) -> None:
    context = fakes.fake(trt.IExecutionContext, set_input_shape=True, set_tensor_address=True)
    assert context.set_input_shape("x", (4, 8))
    assert context.set_input_shape("x", [4, 8])
    assert context.set_input_shape("x", trt.Dims((4, 8)))
    assert context.set_tensor_address(name="x", memory=4096)


def test_an_enum_argument_must_be_the_enum(trt: ModuleType, fakes: FakeFactory) -> None:
    engine = fakes.fake(trt.ICudaEngine)
    strategy = trt.ExecutionContextAllocationStrategy.USER_MANAGED
    assert isinstance(engine.create_execution_context(strategy), trt.IExecutionContext)
    with pytest.raises(ApiMismatch):
        engine.create_execution_context(int(strategy))


def test_answers_must_have_the_declared_type(trt: ModuleType, fakes: FakeFactory) -> None:
    engine = fakes.fake(trt.ICudaEngine, get_tensor_shape=(1, 8))  # a tuple, not Dims
    with pytest.raises(ApiMismatch, match="Dims"):
        engine.get_tensor_shape("x")
    with pytest.raises(ApiMismatch):
        fakes.fake(trt.ICudaEngine, num_io_tensors="2")


def test_read_only_properties_cannot_be_set(trt: ModuleType, fakes: FakeFactory) -> None:
    engine = fakes.fake(trt.ICudaEngine, num_io_tensors=2)
    assert engine.num_io_tensors == 2
    with pytest.raises(AttributeError, match="read-only"):
        engine.num_io_tensors = 3


def test_a_call_without_an_answer_says_which(trt: ModuleType, fakes: FakeFactory) -> None:
    engine = fakes.fake(trt.ICudaEngine)
    with pytest.raises(AssertionError, match=r"ICudaEngine\.get_tensor_dtype"):
        engine.get_tensor_dtype("x")


def test_constructors_are_checked(trt: ModuleType, fakes: FakeFactory) -> None:
    runtime = fakes.constructor(trt.Runtime, lambda logger: fakes.fake(trt.Runtime))
    assert isinstance(runtime(trt.Logger(trt.Logger.WARNING)), trt.Runtime)
    with pytest.raises(ApiMismatch):
        runtime()


def test_every_method_the_project_calls_has_a_parsable_signature(trt: ModuleType) -> None:
    """The checks above are only as good as the parsed docstrings: none may come out empty."""
    members = [
        trt.Runtime.deserialize_cuda_engine,
        trt.ICudaEngine.get_tensor_profile_shape,
        trt.ICudaEngine.create_execution_context,
        trt.IExecutionContext.set_input_shape,
        trt.IExecutionContext.execute_async_v3,
        trt.Builder.build_serialized_network,
        trt.OnnxParser.parse_from_file,
        trt.IOptimizationProfile.set_shape,
        trt.IBuilderConfig.set_memory_pool_limit,
        trt.ICudaEngine.num_io_tensors.fget,
    ]
    for member in members:
        assert signatures(member), member
