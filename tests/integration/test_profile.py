"""`batchserve profile --quick` as the README shows it, on a copy of digits_cnn, with the real
perf_analyzer: the swept rows, a choice within the budget, a config that Triton's own schema
reads and that differs from the original only in the swept fields, and the time it took.

The aim is under two minutes on 2 cores; the bound asserted is generous so that a loaded
machine does not fail the test, and the time is reported (``-s``, or the JUnit property).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.integration.server import MODEL_REPO
from tests.integration.test_readme import BIN, COMMANDS

pytestmark = pytest.mark.slow

# (instances, max_batch_size, queue delay): --quick's axes with digits_cnn's own 1, 64 and
# 25000 us added; batches of one are measured at delay 0 only.
QUICK_ROWS = {
    (count, size, delay)
    for count in (1, 2)
    for size, delay in ((1, 0), (8, 0), (8, 25000), (64, 0), (64, 25000))
}
GENEROUS_BOUND_S = 300


def table_rows(out: str) -> list[list[str]]:
    """The rows under the table's header line, up to its notes or the blank line after it."""
    lines = out.split("\nInstances ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    return [line.split() for line in lines if not line.startswith("  note: ")]


def swept_cleared(config: model_config_pb2.ModelConfig) -> model_config_pb2.ModelConfig:
    rest = model_config_pb2.ModelConfig()
    rest.CopyFrom(config)
    rest.ClearField("max_batch_size")
    rest.ClearField("instance_group")
    rest.dynamic_batching.ClearField("max_queue_delay_microseconds")
    return rest


def test_quick_profile_writes_the_best_config_within_the_budget(
    tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    shutil.copytree(MODEL_REPO / "digits_cnn", tmp_path / "digits_cnn")
    (command,) = [c for c in COMMANDS if c.startswith("batchserve profile")]
    argv = [str(BIN / "batchserve"), *command.split()[1:]]
    argv = [str(tmp_path) if arg == "model_repo" else arg for arg in argv]
    assert "--quick" in argv
    assert str(tmp_path) in argv
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - started
    record_property("profile_quick_seconds", round(seconds, 1))
    print(f"\nbatchserve profile --quick on digits_cnn took {seconds:.1f} s\n{result.stdout}")
    assert result.returncode == 0, result.stdout + result.stderr

    rows = table_rows(result.stdout)
    assert {(int(r[0]), int(r[1]), int(r[2])) for r in rows} == QUICK_ROWS
    assert all(float(r[4]) > 0 for r in rows)
    budget = float(re.findall(r"p99 latency budget: ([\d.]+) ms", result.stdout)[0])
    (chosen,) = [r for r in rows if r[-1] == "*"]
    assert chosen[-2] == "yes"
    assert float(chosen[7]) <= budget

    original = (MODEL_REPO / "digits_cnn" / "config.pbtxt").read_text()
    written = (tmp_path / "digits_cnn" / "config.pbtxt").read_text()
    assert (tmp_path / "digits_cnn" / "config.pbtxt.orig").read_text() == original
    before = text_format.Parse(original, model_config_pb2.ModelConfig())
    after = text_format.Parse(written, model_config_pb2.ModelConfig())
    assert swept_cleared(after) == swept_cleared(before)
    instances, size, delay = (int(cell) for cell in chosen[:3])
    assert max((group.count or 1 for group in after.instance_group), default=1) == instances
    assert after.max_batch_size == size
    assert after.dynamic_batching.max_queue_delay_microseconds == delay
    assert seconds < GENEROUS_BOUND_S


def test_a_setting_the_server_refuses_is_a_row_not_a_crash(tmp_path: Path) -> None:
    model = tmp_path / "digits_cnn"
    shutil.copytree(MODEL_REPO / "digits_cnn", model)
    config = (model / "config.pbtxt").read_text()
    config = config.replace(
        "dynamic_batching {", "dynamic_batching {\n  preferred_batch_size: [16]"
    )
    (model / "config.pbtxt").write_text(config)
    argv = [str(BIN / "batchserve"), "profile", "digits_cnn", "--model-repository", str(tmp_path),
            "--quick", "--instance-counts", "1", "--max-batch-sizes", "8,16",
            "--queue-delays", "0", "--concurrency", "4", "--latency-budget", "1000",
            "--dry-run"]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    refused, measured = table_rows(result.stdout)
    assert refused == ["1", "8", "0", "-", "-", "-", "-", "-", "-", "refused"]
    assert "preferred_batch_size 16 is outside 1..max_batch_size (8)" in result.stdout
    assert measured[:4] == ["1", "16", "0", "4"]
    assert measured[-2:] == ["yes", "*"]
    assert "not written: --dry-run" in result.stdout
    assert (model / "config.pbtxt").read_text() == config
    assert not list(model.glob("config.pbtxt.orig*"))
