"""torch's thread pools, sized once per process from the first program's config or from the
CPUs the process may use: real torch, in a fresh process per case (the pools are
process-wide), loading real torch.export programs through the backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from batchserve.backends.torch_threads import named_counts  # noqa: E402
from batchserve.core.cpu_budget import runtime_threads  # noqa: E402
from batchserve.core.errors import ModelConfigError  # noqa: E402
from batchserve.proto.model_config_pb2 import ModelConfig  # noqa: E402
from pt2_models import mlp_program  # noqa: E402

HOST = os.cpu_count() or 1
CHILD = r"""
import functools, json, logging, sys
from pathlib import Path
import numpy as np
import torch
from google.protobuf import text_format
from batchserve.backends import torch_threads
from batchserve.backends.torch_pt2 import TorchBackend
from batchserve.core.cpu_budget import runtime_threads
from batchserve.core.device import CPU
from batchserve.proto.model_config_pb2 import ModelConfig

warnings = []
logging.getLogger("batchserve.backends.torch_threads").addHandler(
    type("H", (logging.Handler,), {"emit": lambda self, r: warnings.append(r.getMessage())})()
)
program, cgroup_root = Path(sys.argv[1]), sys.argv[2]
if cgroup_root:
    torch_threads.runtime_threads = functools.partial(runtime_threads, Path(cgroup_root))
seen = []
for text in sys.argv[3:]:
    config = text_format.Parse(text, ModelConfig())
    backend = TorchBackend()
    backend.load(program, config, CPU)
    y = backend.infer({"x": np.ones((64, 8), np.float32)})["y"]
    seen.append([torch.get_num_threads(), torch.get_num_interop_threads(), y.shape[0]])
print(json.dumps({"seen": seen, "log": warnings}))
"""


def _threads(params: dict[str, str]) -> str:
    entries = " ".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in params.items()
    )
    return f'name: "m" max_batch_size: 64 {entries}'


def _run(
    program: Path, *configs: str, cgroup_root: Path | None = None, env: dict[str, str] | None = None
) -> dict[str, list[object]]:
    environment = {
        k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(program), str(cgroup_root or ""), *configs],
        capture_output=True, text=True, env={**environment, **(env or {})}, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, list[object]] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mlp_program(tmp_path_factory.mktemp("mlp") / "m" / "1" / "model.pt2")


@pytest.mark.skipif(HOST < 2, reason="a second count needs two CPUs to differ from one")
def test_the_first_config_sets_both_pools_and_a_later_one_is_told_they_hold(
    program: Path,
) -> None:
    one = _threads({"INTRA_OP_THREAD_COUNT": "1", "INTER_OP_THREAD_COUNT": "1"})
    two = _threads({"INTRA_OP_THREAD_COUNT": "2"})
    result = _run(program, one, two)
    assert result["seen"] == [[1, 1, 64], [1, 1, 64]]
    (warning,) = result["log"]
    assert "INTRA_OP_THREAD_COUNT 2 (torch runs 1) ignored" in warning
    assert "when model 'm' loaded" in warning


def test_without_a_count_the_pools_follow_the_cgroups_cpu_quota(
    program: Path, tmp_path: Path
) -> None:
    """A quota of one core (``cpu.max``, as a Kubernetes CPU limit of 1 writes it) on this
    machine's cores: torch alone would take one thread per core."""
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/pod\n")
    (tmp_path / "sys" / "fs" / "cgroup" / "pod").mkdir(parents=True)
    (tmp_path / "sys" / "fs" / "cgroup" / "pod" / "cpu.max").write_text("100000 100000\n")
    plain = _threads({})
    assert _run(program, plain, cgroup_root=tmp_path)["seen"] == [[1, 1, 64]]
    here = runtime_threads()  # this machine's own quota, if any
    assert _run(program, plain)["seen"] == [[here, here, 64]]


def test_omp_num_threads_stands_where_the_environment_sets_it(
    program: Path, tmp_path: Path
) -> None:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/\n")
    (tmp_path / "sys" / "fs" / "cgroup").mkdir(parents=True)
    (tmp_path / "sys" / "fs" / "cgroup" / "cpu.max").write_text("300000 100000\n")
    seen = _run(program, _threads({}), cgroup_root=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert seen["seen"][0][0] == 1


@pytest.mark.parametrize(
    ("text", "want"), [(str(HOST), HOST), (" 1 ", 1), ("0", 0), ("-1", 0), ("100000", HOST)]
)
def test_counts_are_read_as_tritons_pytorch_backend_reads_them(text: str, want: int) -> None:
    """Zero or less: torch's own count, as in Triton; more than the host's CPUs: lowered to
    them (100000 crashed the process at the first batch: libgomp's pool)."""
    config = ModelConfig()
    config.parameters["INTRA_OP_THREAD_COUNT"].string_value = text
    assert named_counts(config, Path("m/1/model.pt2")) == (want, 0)


def test_a_count_that_is_not_a_number_names_the_file_and_the_parameter() -> None:
    config = ModelConfig()
    config.parameters["INTER_OP_THREAD_COUNT"].string_value = "two"
    with pytest.raises(
        ModelConfigError, match=r"m/1/model.pt2: parameter INTER_OP_THREAD_COUNT='two'"
    ):
        named_counts(config, Path("m/1/model.pt2"))
