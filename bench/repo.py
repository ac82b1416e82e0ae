"""The model repositories a run serves: the models asked for, built ones, and variants.

The ResNet-like CNN is exported through the real ``batchserve export`` command and deployed
as a compute-bound CNN is on a CPU: one instance per core, one ONNX Runtime thread each; the
identity model (the request-overhead floor) is built with onnx.helper; the batching-off
variant of a model is its completed config without ``dynamic_batching``, beside links to its
files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import onnx
from batchserve.backends.onnx_file import read_onnx_signature
from batchserve.backends.selection import ONNX
from batchserve.models.model_config import CONFIG_FILENAME, complete_config, load_pbtxt, to_pbtxt
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup
from batchserve.zoo import MAX_QUEUE_DELAY_US
from onnx import TensorProto, helper

from bench.common import ROOT

RESNET = "resnet18ish"
FP32_IMAGE = ("--input", "image:FP32:batch,3,224,224")
IDENTITY_WIDTH = 16
MAX_BATCH = 64
EXPORT_TIMEOUT_S = 900


def onnx_file(model_dir: Path) -> Path:
    """The newest version's ONNX file (the one the server loads by default)."""
    config_path = model_dir / CONFIG_FILENAME
    config = load_pbtxt(config_path) if config_path.exists() else ModelConfig()
    filename = config.default_model_filename or ONNX.default_filename
    versions = sorted(
        (int(p.name) for p in model_dir.iterdir() if p.name.isdigit() and (p / filename).exists()),
        reverse=True,
    )
    if not versions:
        raise ValueError(f"{model_dir}: no version directory holds {filename} (ONNX only)")
    return model_dir / str(versions[0]) / filename


def completed_config(model_dir: Path) -> ModelConfig:
    """The config the server will use: config.pbtxt (if any) completed from the ONNX file."""
    path = model_dir / CONFIG_FILENAME
    written = load_pbtxt(path) if path.exists() else ModelConfig()
    signature = read_onnx_signature(onnx_file(model_dir))
    return complete_config(written, name=model_dir.name, model_format=ONNX, signature=signature)


def without_batching(model_dir: Path, repo: Path) -> Path:
    """``repo/<model>``: a copy under a config with no dynamic batching.

    A copy, not links: the server refuses version directories that lead outside its repository.
    """
    config = completed_config(model_dir)
    config.ClearField("dynamic_batching")
    target = repo / model_dir.name
    shutil.copytree(model_dir, target, ignore=shutil.ignore_patterns(CONFIG_FILENAME))
    (target / CONFIG_FILENAME).write_text(to_pbtxt(config))
    return target


def write_identity(repo: Path) -> Path:
    """identity: FP32 [-1, 16] in, the same out; batched like the shipped models."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT__0"], ["OUTPUT__0"])],
        "identity",
        [helper.make_tensor_value_info("INPUT__0", TensorProto.FLOAT, ["batch", IDENTITY_WIDTH])],
        [helper.make_tensor_value_info("OUTPUT__0", TensorProto.FLOAT, ["batch", IDENTITY_WIDTH])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    target = repo / "identity"
    (target / "1").mkdir(parents=True)
    onnx.save(model, str(target / "1" / "model.onnx"))
    config = (
        f'name: "identity"\nmax_batch_size: {MAX_BATCH}\n'
        f"dynamic_batching {{\n  max_queue_delay_microseconds: {MAX_QUEUE_DELAY_US}\n}}\n"
    )
    (target / CONFIG_FILENAME).write_text(config)
    return target


IMAGE_MEAN = "image_mean"
IMAGE_CHW = (3, 192, 192)


def write_image_mean(repo: Path) -> Path:
    """image_mean: one FP32 3x192x192 image in (the bench CNNs' input), its three channel
    means out. The model's work is one pass over the image, so a request's cost is mostly
    moving its 432 KiB."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["image"], ["means"], axes=[2, 3], keepdims=0)],
        IMAGE_MEAN,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", *IMAGE_CHW])],
        [helper.make_tensor_value_info("means", TensorProto.FLOAT, ["batch", IMAGE_CHW[0]])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    target = repo / IMAGE_MEAN
    (target / "1").mkdir(parents=True)
    onnx.save(model, str(target / "1" / "model.onnx"))
    (target / CONFIG_FILENAME).write_text(
        f'name: "{IMAGE_MEAN}"\nmax_batch_size: 16\ndynamic_batching {{ }}\n'
    )
    return target


def export_resnet(repo: Path, name: str = RESNET, image: Sequence[str] = FP32_IMAGE) -> Path:
    """``bench.models:resnet18ish`` exported as ``name`` and served one instance per core;
    ``image`` declares its input (``--input`` and, for bytes, ``--normalize``)."""
    return one_instance_per_core(export(repo, f"bench.models:{RESNET}", name, image))


def export(repo: Path, factory: str, name: str, image: Sequence[str]) -> Path:
    """``repo/name``: ``factory`` exported with the real CLI (verified against PyTorch),
    dynamic batching on, its config as the exporter writes it (no instances, no threads)."""
    argv = [
        sys.executable, "-m", "batchserve.cli", "export", factory,
        "--name", name, *image, "--output", "logits",
        "--model-repository", str(repo), "--max-batch-size", str(MAX_BATCH),
        "--dynamic-batching", "--max-queue-delay-us", str(MAX_QUEUE_DELAY_US),
        "--batch-sizes", "1,2",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), _pythonpath()]))}
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"batchserve export {name} failed:\n{done.stdout}{done.stderr}")
    return repo / name


def one_instance_per_core(model_dir: Path) -> Path:
    """Serve a compute-bound model with one single-threaded instance per usable core.

    On the 2-core reference machine two one-thread sessions ran ResNet-18 at 41-49 samples/s
    side by side against 25-41 for one two-thread session, and batchserve at c=16 went from
    37 to 44-45/s (bench/NOTES.md): per-sample cost on a CPU hardly falls with batch size,
    so cores kept busy matter more than bigger batches, and one thread needs no spinning.
    """
    path = model_dir / CONFIG_FILENAME
    config = load_pbtxt(path)
    config.ClearField("instance_group")
    config.instance_group.add(count=usable_cores(), kind=ModelInstanceGroup.KIND_CPU)
    config.parameters["intra_op_thread_count"].string_value = "1"
    path.write_text(to_pbtxt(config))
    return model_dir


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def _pythonpath() -> str:
    return os.environ.get("PYTHONPATH", "")
