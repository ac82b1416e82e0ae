"""The project's CUDA runtime calls exist in the installed cuda-bindings, as the code makes them.

Read from the source (``ast``): every ``call("cudaX", ...)`` of ``devices/cuda.py`` and every
attribute reached from the runtime module in any module of the package (``cudart.X.Y``,
``runtime().X``), with the number of arguments each call passes, and every ``cudaError*``
name it compares against. Then the same module over the stub driver: no device, and the
errors the project raises for that.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path

import batchserve
import pytest
from batchserve.core.errors import DeviceUnavailable
from batchserve.devices import cuda
from cuda.bindings import runtime as cudart

PACKAGE = Path(batchserve.__file__).parent
RUNTIME_NAMES = ("cudart", "runtime")  # the module's local name, and the function returning it


def _chain(node: ast.expr) -> list[str] | None:
    """``cudart.a.b`` or ``runtime().a.b`` (any ``x.runtime()`` too) as ["a", "b"], else None."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.insert(0, node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "cudart":
        return names
    if isinstance(node, ast.Call) and not node.args:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        return names if called == "runtime" else None
    return None


def runtime_uses(tree: ast.AST) -> Iterator[tuple[str, int | None]]:
    """(dotted name in the runtime module, positional arguments passed or None if not called)."""
    called: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        first = node.args[0] if node.args else None
        if getattr(node.func, "id", None) == "call" and isinstance(first, ast.Constant):
            yield str(first.value), len(node.args) - 1
        elif (chain := _chain(node.func)) and not any(
            isinstance(a, ast.Starred) for a in node.args
        ):
            called.add(id(node.func))
            yield ".".join(chain), len(node.args)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in called and (chain := _chain(node)):
            yield ".".join(chain), None


def error_names(tree: ast.AST) -> set[str]:
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("cudaError")
    }


def modules_using_the_runtime() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if "cuda.bindings" in path.read_text() or path == PACKAGE / "devices" / "cuda.py"
    )


def resolve(dotted: str) -> object:
    target: object = cudart
    for name in dotted.split("."):
        target = getattr(target, name)
    return target


@pytest.mark.parametrize(
    "module", modules_using_the_runtime(), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_every_runtime_name_used_exists_and_takes_the_arguments_given(module: Path) -> None:
    tree = ast.parse(module.read_text())
    uses = sorted(set(runtime_uses(tree)), key=str)
    assert uses, f"{module} makes no CUDA runtime call the test can find"
    for dotted, arguments in uses:
        target = resolve(dotted)  # AttributeError names what this cuda-bindings lacks
        if arguments is not None:
            inspect.signature(target).bind(*range(arguments))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "module", modules_using_the_runtime(), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_every_cuda_error_name_compared_against_exists(module: Path) -> None:
    missing = error_names(ast.parse(module.read_text())) - set(cudart.cudaError_t.__members__)
    assert not missing


def test_the_scan_finds_the_calls_it_must() -> None:
    """The scan itself: it sees a call(), a chained enum and a direct call in cuda.py."""
    uses = dict(runtime_uses(ast.parse((PACKAGE / "devices" / "cuda.py").read_text())))
    assert uses["cudaMemcpyAsync"] == 5
    assert uses["cudaGetErrorString"] == 1
    assert "cudaMemcpyKind.cudaMemcpyHostToDevice" in uses
    assert uses["cudaEventRecord"] == 2
    assert "cudaEventBlockingSync" in uses


def test_the_blocking_event_flags_are_taken_by_the_real_call() -> None:
    """The flags ``cuda.Stream`` creates its event with get as far as the (stub) driver."""
    flags = cudart.cudaEventBlockingSync | cudart.cudaEventDisableTiming
    error, _ = cudart.cudaEventCreateWithFlags(flags)
    assert error == cudart.cudaError_t.cudaErrorNoDevice


def test_the_stub_driver_has_no_device() -> None:
    error, _ = cudart.cudaGetDeviceCount()
    assert error == cudart.cudaError_t.cudaErrorNoDevice


@pytest.mark.parametrize(
    "make",
    [cuda.Stream, lambda: cuda.DeviceBuffer(64), lambda: cuda.set_device(0)],
    ids=["stream", "device buffer", "set device"],
)
def test_without_a_device_cuda_work_is_device_unavailable(make: object) -> None:
    with pytest.raises(DeviceUnavailable, match="cudaErrorNoDevice"):
        make()  # type: ignore[operator]
