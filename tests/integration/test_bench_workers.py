"""The workers bench against a real server with two workers and the real perf_analyzer: the
figures each point records come from the processes and the machine, not from the driver."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from bench import cpu_split, workers
from bench.perf import PaSettings, run
from tests.integration.server import REPO_ROOT


def test_a_point_records_each_process_and_how_busy_the_machine_was(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(REPO_ROOT / "model_repo" / "digits_cnn", repo / "digits_cnn")
    settings = PaSettings(800, stability=1000, max_trials=3, grpc_connection_per_client=True)
    (point,) = workers.measure(2, repo, settings, tmp_path, [("digits_cnn", "grpc", 16)], run)
    assert point.throughput > 0
    assert len(point.worker_us) == 2
    assert point.engine_us > 0
    assert sum(point.worker_us) > 0
    assert point.load_us > 0  # perf_analyzer's own CPU, read once it has ended
    # from the metrics port: every request travelled in some frame, some perhaps together
    assert 1.0 <= point.per_frame <= 16
    # perf_analyzer's 16 clients and three server processes keep a good part of the cores busy
    assert 0.1 < point.machine_busy <= 1.0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to split")
def test_a_server_on_cpus_of_its_own_keeps_its_workers_there_and_each_side_is_measured(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(REPO_ROOT / "model_repo" / "digits_cnn", repo / "digits_cnn")
    split = cpu_split.split([(cpu,) for cpu in sorted(os.sched_getaffinity(0))])
    assert split is not None
    settings = PaSettings(800, stability=1000, max_trials=3, cpus=split.load)
    with workers.serving(2, repo, split.server) as server:
        # the model-owning process and the workers it started later, all on the server's
        assert [os.sched_getaffinity(pid) for pid in server.pids] == [set(split.server)] * 3
        point = workers.take(server, ("digits_cnn", "http", 16), settings, tmp_path)
    assert point.throughput > 0
    assert point.server_busy is not None
    assert point.load_busy is not None
    # three server processes on their CPUs, perf_analyzer's 16 clients on the others
    assert 0.1 < point.server_busy <= 1.0
    assert 0.05 < point.load_busy <= 1.0
