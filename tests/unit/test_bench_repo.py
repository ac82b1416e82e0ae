"""The repositories a benchmark run serves, built from real files and run in ONNX Runtime."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import onnx
from batchserve.models.model_config import load_pbtxt
from batchserve.proto.model_config_pb2 import ModelInstanceGroup
from onnx import TensorProto, helper

from bench import ceiling, repo
from bench.inputs import plan

ROOT = Path(__file__).resolve().parents[2]


def test_identity_model_is_batched_and_echoes_in_onnx_runtime(tmp_path: Path) -> None:
    directory = repo.write_identity(tmp_path)
    config = repo.completed_config(directory)
    assert config.max_batch_size == 64
    assert config.HasField("dynamic_batching")
    assert [list(t.dims) for t in config.input] == [[16]]
    inputs = plan("identity", config, {})
    points = ceiling.measure(repo.onnx_file(directory), inputs, (1, 4), budget_s=0.01)
    assert [(p.model, p.batch) for p in points] == [("identity", 1), ("identity", 4)]
    assert all(p.calls >= ceiling.MIN_CALLS and p.samples_per_s > 0 for p in points)
    four = ceiling.measure(repo.onnx_file(directory), inputs, (1, 4), budget_s=0.0, rounds=4)
    assert [p.calls for p in four] == [4 * 2, 4 * 2]  # each round times ceil(5 / 4) calls


def test_unbatched_variant_keeps_everything_but_dynamic_batching(tmp_path: Path) -> None:
    source = ROOT / "model_repo" / "char_lstm"
    target = repo.without_batching(source, tmp_path / "off")
    written = load_pbtxt(target / "config.pbtxt")
    assert not written.HasField("dynamic_batching")
    assert written.max_batch_size == 64
    assert written.batchserve.sequence_length_input == "lengths"
    copied = target / "1" / "model.onnx"
    assert not copied.is_symlink()
    assert copied.read_bytes() == (source / "1" / "model.onnx").read_bytes()
    assert repo.completed_config(source).HasField("dynamic_batching")


def test_onnx_file_is_the_newest_version(tmp_path: Path) -> None:
    directory = repo.write_identity(tmp_path)
    for version in ("2", "10"):
        shutil.copytree(directory / "1", directory / version)
    (directory / "11").mkdir()  # no model file: not a version the server can load
    assert repo.onnx_file(directory) == directory / "10" / "model.onnx"


def test_ceiling_of_a_model_without_batch_axis_is_batch_1(tmp_path: Path) -> None:
    directory = tmp_path / "fixed"
    (directory / "1").mkdir(parents=True)
    tensor = [2, 3]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, tensor)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, tensor)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(directory / "1" / "model.onnx"))
    config = repo.completed_config(directory)
    assert config.max_batch_size == 0
    points = ceiling.measure(
        repo.onnx_file(directory), plan("fixed", config, {}), (1, 8), budget_s=0.01
    )
    assert [p.batch for p in points] == [1]


def test_compute_bound_model_gets_one_single_threaded_instance_per_core(tmp_path: Path) -> None:
    directory = repo.write_identity(tmp_path)
    (directory / "config.pbtxt").write_text(
        'name: "identity" max_batch_size: 64 instance_group { count: 5 kind: KIND_AUTO } '
        'parameters { key: "intra_op_thread_count" value { string_value: "0" } }'
    )
    repo.one_instance_per_core(directory)
    config = repo.completed_config(directory)
    groups = [(g.count, g.kind) for g in config.instance_group]
    assert groups == [(len(os.sched_getaffinity(0)), ModelInstanceGroup.KIND_CPU)]
    assert config.parameters["intra_op_thread_count"].string_value == "1"
    assert config.max_batch_size == 64  # the rest of the config is kept
