"""The stub generator refuses to guess where a default body would be wrong."""

from __future__ import annotations

from pathlib import Path

import cuda.bindings
import pytest

from tests.stubs.gen_stubs import FAMILIES, Family, Stub, pointer_returns, source


def family(stem: str) -> Family:
    return next(f for f in FAMILIES if f.stem == stem)


@pytest.mark.parametrize(
    ("stem", "symbol"),
    [
        ("libcudart.so", "cudaGetSomethingString"),  # by its name
        ("libcublas.so", "cublasGetSomethingName"),
        ("libnvinfer.so", "createInferSomething_INTERNAL"),  # TensorRT: every body by hand
    ],
)
def test_a_symbol_that_may_return_a_pointer_needs_a_hand_written_body(
    stem: str, symbol: str
) -> None:
    stub = Stub(f"{stem}.1", family(stem), {symbol})
    with pytest.raises(SystemExit, match=symbol):
        source(stub, set())


def test_cuda_bindings_declarations_mark_pointer_results() -> None:
    pointers = pointer_returns(Path(cuda.bindings.__file__).parent)
    assert {"cudaGetErrorString", "cudaGetErrorName"} <= pointers
    stub = Stub("libcudart.so.13", family("libcudart.so"), {"cudaMalloc", "cudaFancy"})
    with pytest.raises(SystemExit, match="cudaFancy"):
        source(stub, pointers | {"cudaFancy"})


def test_other_symbols_answer_the_library_error_and_templates_are_kept() -> None:
    stub = Stub("libcudart.so.13", family("libcudart.so"), {"cudaMalloc", "cudaGetErrorString"})
    text = source(stub, set())
    assert "int cudaMalloc(void) { return 100; }" in text  # cudaErrorNoDevice
    assert "const char *cudaGetErrorString(int error)" in text
    assert "int cudaGetErrorString(void)" not in text
