"""A model.pt2 crafted to run code when loaded: torch.export.load runs it, batchserve does not.

Each attack creates a marker directory when it succeeds. The first test shows, on the installed
torch, that the crafted archives really are attacks on ``torch.export.load``; the others
show that batchserve refuses them (or drops the part that carried the attack) and that the
marker is never created.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pt2_constants = pytest.importorskip("torch.export.pt2_archive.constants")

from batchserve.backends.torch_archive import expression_problem  # noqa: E402
from batchserve.backends.torch_pt2 import TorchBackend  # noqa: E402
from batchserve.core.device import CPU  # noqa: E402
from batchserve.core.errors import ModelConfigError  # noqa: E402
from batchserve.proto.model_config_pb2 import ModelConfig  # noqa: E402
from pt2_models import (  # noqa: E402
    ROW,
    edit_json,
    evil_pickle,
    mlp_program,
    rewrite,
)

Attack = Callable[[Path, Path, Path], Path]  # (valid archive, crafted archive, marker)
MODEL = "models/model.json"


def pickled_sample_inputs(source: Path, target: Path, marker: Path) -> Path:
    """torch.load(weights_only=True) refuses it, then torch retries with weights_only=False."""
    payload = evil_pickle(marker)
    return rewrite(
        source, target, lambda n, d: payload if n == "data/sample_inputs/model.pt" else None, {}
    )


def pickled_weight(source: Path, target: Path, marker: Path) -> Path:
    """A weight marked use_pickle: torch.load(weights_only=False)."""

    def mark(document: dict[str, Any]) -> None:
        next(iter(document["config"].values()))["use_pickle"] = True

    config = edit_json("data/weights/model_weights_config.json", mark)
    payload = evil_pickle(marker)

    def edit(name: str, data: bytes) -> bytes | None:
        return payload if name == "data/weights/weight_0" else config(name, data)

    return rewrite(source, target, edit, {})


def injected_input_name(source: Path, target: Path, marker: Path) -> Path:
    """The input's name pasted into the source FX execs: a default argument that runs."""
    evil = f"x=__import__('os').mkdir({str(marker)!r})"
    text = lambda n, d: d.decode().replace('"x"', json.dumps(evil)).encode() if n == MODEL else None  # noqa: E731
    return rewrite(source, target, text, {})


def injected_symbolic_size(source: Path, target: Path, marker: Path) -> Path:
    """A symbolic size is sympify'd, which evals it."""

    def change(node: object) -> None:
        if isinstance(node, dict):
            if "expr_str" in node:
                node["expr_str"] = f"__import__('os').mkdir({str(marker)!r}) and {node['expr_str']}"
            for value in node.values():
                change(value)
        elif isinstance(node, list):
            for value in node:
                change(value)

    return rewrite(source, target, edit_json(MODEL, change), {})


def injected_guard(source: Path, target: Path, marker: Path) -> Path:
    """guards_code becomes a function the program's module calls on every input."""

    def change(document: dict[str, Any]) -> None:
        document["guards_code"] = [f"__import__('os').mkdir({str(marker)!r}) is not None"]

    return rewrite(source, target, edit_json(MODEL, change), {})


def opaque_constant(source: Path, target: Path, marker: Path) -> Path:
    """An opaque constant is pickle.loads'ed (torch 2.13; 2.11 refuses the prefix itself)."""

    def change(document: dict[str, Any]) -> None:
        document["config"]["evil"] = {
            "path_name": "opaque_obj_0",
            "is_param": False,
            "use_pickle": True,  # keeps torch from reading it as a raw tensor first
            "tensor_meta": None,
        }

    edit = edit_json("data/constants/model_constants_config.json", change)
    return rewrite(source, target, edit, {"data/constants/opaque_obj_0": evil_pickle(marker)})


def aotinductor_library(source: Path, target: Path, marker: Path) -> Path:
    """An AOTInductor entry: torch dlopens the shared library it names (native code)."""
    return rewrite(
        source, target, lambda n, d: None, {"data/aotinductor/model/evil.so": b"\x7fELF"}
    )


def injected_keyword(source: Path, target: Path, marker: Path) -> Path:
    """A keyword input's name, pasted in quotes into the forward FX generates."""

    def change(document: dict[str, Any]) -> None:
        signature = document["graph_module"]["module_call_graph"][0]["signature"]
        spec = json.loads(signature["in_spec"])
        evil = f"x':__import__('os').mkdir({str(marker)!r}),'y"
        spec[1]["children_spec"][1]["context"] = json.dumps([evil])
        signature["in_spec"] = json.dumps(spec)

    return rewrite(source, target, edit_json(MODEL, change), {})


REFUSED = [
    pickled_weight,
    injected_input_name,
    injected_symbolic_size,
    injected_keyword,
    opaque_constant,
]
NEUTRALISED = [pickled_sample_inputs, injected_guard]
RUN_BY_TORCH = [
    pickled_sample_inputs,
    pickled_weight,
    injected_input_name,
    injected_symbolic_size,
    injected_guard,
    opaque_constant,
]


def _crafted(attack: Attack, tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "marker"
    source = mlp_program(tmp_path / "valid" / "model.pt2")
    return attack(source, tmp_path / "model.pt2", marker), marker


def _load(path: Path) -> TorchBackend:
    backend = TorchBackend()
    backend.load(path, ModelConfig(name="m", max_batch_size=8), CPU)
    return backend


@pytest.mark.filterwarnings("ignore")  # torch warns loudly on its way to running the payload
@pytest.mark.parametrize("attack", RUN_BY_TORCH, ids=lambda a: a.__name__)
def test_the_crafted_archives_run_code_through_torch_export_load(
    attack: Attack, tmp_path: Path
) -> None:
    if attack is opaque_constant and not hasattr(pt2_constants, "OPAQUE_OBJ_FILENAME_PREFIX"):
        pytest.skip(f"torch {torch.__version__} has no opaque constants (it refuses the entry)")
    path, marker = _crafted(attack, tmp_path)
    with contextlib.suppress(Exception):  # most payloads break the load after they ran
        torch.export.load(str(path)).module()(torch.ones(2, ROW))
    assert marker.exists(), (
        f"torch {torch.__version__}'s torch.export.load no longer runs {attack.__name__}; "
        "batchserve still refuses it, but torch_archive's notes may be out of date"
    )


@pytest.mark.parametrize("attack", REFUSED, ids=lambda a: a.__name__)
def test_batchserve_refuses_an_archive_that_would_run_code(attack: Attack, tmp_path: Path) -> None:
    path, marker = _crafted(attack, tmp_path)
    with pytest.raises(ModelConfigError, match=r"archive entry .* not loaded"):
        _load(path)
    assert not marker.exists()


@pytest.mark.parametrize("attack", NEUTRALISED, ids=lambda a: a.__name__)
def test_batchserve_drops_the_parts_torch_would_unpickle_or_exec(
    attack: Attack, tmp_path: Path
) -> None:
    path, marker = _crafted(attack, tmp_path)
    backend = _load(path)
    assert backend.infer({"x": np.ones((2, ROW), np.float32)})["y"].shape == (2, 4)
    assert not marker.exists()


def test_an_aotinductor_build_is_refused_as_native_code(tmp_path: Path) -> None:
    path, _ = _crafted(aotinductor_library, tmp_path)
    with pytest.raises(ModelConfigError, match=r"AOTInductor build \(compiled native code"):
        _load(path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("Symbol('s77', positive=True, integer=True)", ""),
        ("Mul(Integer(32), Symbol('s2', positive=True, integer=True))", ""),
        ("FloorDiv(s0, 2) + Max(s1, 1)", ""),
        ("__import__('os').system('id')", "'__import__' is not"),
        ("open('x', 'w')", "'open' is not"),
        ("s0.__class__", "unexpected '.__class__'"),
        ("Symbol('a\"b')", "unexpected"),
        ("lambda: 0", "'lambda' is not"),
    ],
)
def test_symbolic_sizes_must_be_plain_arithmetic(text: str, problem: str) -> None:
    found = expression_problem(text, frozenset({"FloorDiv"}))
    assert (found == "") if not problem else (problem in found)
