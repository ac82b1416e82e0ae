"""The TensorRT module of the pass (``GPU_CONTRACT_TENSORRT`` names its major) and a factory of
fakes checked against it."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.gpu_contract.pybind_fakes import FakeFactory


@pytest.fixture(scope="session")
def trt() -> ModuleType:
    import tensorrt

    return tensorrt


@pytest.fixture(scope="session")
def major(trt: ModuleType) -> int:
    return int(trt.__version__.split(".", 1)[0])


@pytest.fixture(scope="session")
def fakes(trt: ModuleType) -> FakeFactory:
    return FakeFactory(trt)
