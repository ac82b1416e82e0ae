"""GPU_RESULTS.md rendering: every section from known figures, skips and failures spelled out."""

from __future__ import annotations

import json

from bench.gpu import report, targets
from bench.gpu.plan import JUDGED
from bench.gpu.records import (
    RESNET,
    Accuracy,
    EnginePoint,
    ExportResult,
    GpuResults,
    InstanceProbe,
    Key,
    MemoryReading,
    Phase,
    PytestRun,
    RuntimeStatus,
    Served,
    Variant,
    dump,
)
from bench.records import BATCHSERVE, PaRow, ServerPoint

KEY = Key(RESNET, "pt2", "fp16")
MIB = 2**20


def sample(mode: str = "gpu") -> GpuResults:
    found = GpuResults(mode, ["Machine: test box", "GPU: NVIDIA H100 80GB HBM3, 79.6 GiB"])
    found.command, found.duration_s = "python -m bench.gpu", 754.0
    found.load_tool = "load: bench.gpu.load"
    found.runtimes = [
        RuntimeStatus("pt2", "PyTorch pt2 program, CUDA", True, "2.11.0"),
        RuntimeStatus("tensorrt", "TensorRT engine", False, "", "import tensorrt failed: nope"),
    ]
    found.phases = [Phase("GPU tests", 300, 41.5), Phase("served: 2 cases", 200, 0)]
    found.dropped = ["digits_cnn pt2 fp16, batching on, graphs on"]
    found.tests = [
        PytestRun("tests/unit", 12, 1, 5, 0, 40.0, (("t.py::test_x", "assert 1 == 2"),),
                (("needs tensorrt", 4), ("needs ORT CUDA", 1))),
    ]  # fmt: skip
    found.exports = [
        ExportResult(KEY, True, 61.0, "/x", "torch.export: max abs error 0.01"),
        ExportResult(Key(RESNET, "pt2", "fp32"), False, 3.0, error="exit 2: bad op"),
    ]
    found.accuracy = [Accuracy(KEY, "logits", 8, 0.0421, 0.0123, 1.0)]
    found.engine = [EnginePoint(KEY, 1, 0.002, 100), EnginePoint(KEY, 64, 0.032, 40)]
    row = PaRow(1800.0, 30_000.0, 52_000.0, 0.0, 0.0)
    grpc = ServerPoint(BATCHSERVE, RESNET, "grpc", 64, "on", row, 6400, 100, 12.0, 3.5, 0.4, 64)
    failed = ServerPoint(BATCHSERVE, RESNET, "http", 1, "on", None, error="x\nrefused")
    found.served = [Served(KEY, JUDGED, grpc), Served(KEY, JUDGED, failed)]
    probe = InstanceProbe("gpu:0", 300 * MIB, 12 * MIB, 1068 * MIB, 64)
    found.memory = [MemoryReading(KEY, JUDGED, (probe,), 1000 * MIB, 2100 * MIB, 2300 * MIB)]
    return found


def rendered(found: GpuResults) -> str:
    return report.render(found, targets.evaluate(found))


def test_every_section_is_rendered() -> None:
    text = rendered(sample())
    for title in ("# GPU check", "## Runtimes", "## Time budget", "## GPU tests",
                  "## Exports", "## Accuracy", "## In-process engine", "## Served over HTTP",
                  "## Memory", "## Targets", "## Notes"):  # fmt: skip
        assert title in text, title
    assert "CPU dry run" not in text
    assert "the run took 12.6 min" in text


def test_skipped_runtimes_and_tests_carry_their_reasons() -> None:
    text = rendered(sample())
    assert "| TensorRT engine | tensorrt | **skipped** | — | import tensorrt failed: nope |" in text
    assert "| tests/unit | 12 | 1 | 0 | 5 | 40 |  |" in text
    assert "- 4 x needs tensorrt" in text
    assert "- t.py::test_x: assert 1 == 2" in text
    assert "- digits_cnn pt2 fp16, batching on, graphs on" in text


def test_figures_are_rendered_in_their_units() -> None:
    text = rendered(sample())
    assert "| resnet50ish | pt2 | fp16 | logits | 0.0421 | 0.0123 | 100% |" in text
    assert "| resnet50ish | pt2 | fp16 | 500 (2.000) | 2,000 (32.000) |" in text
    # 1,800/s at mean batch 64, where the engine does 2,000/s: 0.90.
    assert "| gRPC | 64 | 1,800 | 30.00 | 52.00 | 64.0 | 64 | 1875 | 0.90 |" in text
    assert "| HTTP | 1 | failed | — | — | — | — | — | — |" in text
    assert "| **failed**: exit 2: bad op |" in text


def test_memory_compares_the_probe_with_nvml_growth() -> None:
    text = rendered(sample())
    assert "| 300 | 12.00 | 64 | 1,068 | 1,100 | 1,300 | 1.22 |" in text


def test_without_nvml_the_memory_columns_say_so() -> None:
    found = sample()
    probe = found.memory[0].instances
    found.memory = [MemoryReading(KEY, Variant(False, False), probe)]
    text = rendered(found)
    assert "batching off, graphs off" in text
    assert text.count("— (no NVML)") == 2


def test_targets_and_failed_points_are_listed() -> None:
    text = rendered(sample())
    assert "resnet50ish pt2 fp16 gRPC, best c >= 0.8 x engine at the same batch" in text
    assert "**PASS**" in text
    assert "point failed: refused" in text
    assert "- Failed (resnet50ish pt2 fp16 (batching on, graphs off) HTTP c=1): refused" in text


def test_the_dry_run_says_it_is_not_a_gpu_result() -> None:
    text = rendered(sample("cpu"))
    assert "**CPU dry run**" in text
    assert "not GPU verdicts" in text


def test_a_run_with_nothing_present_still_renders() -> None:
    empty = GpuResults(header=["Machine: bare"])
    text = rendered(empty)
    assert "Not run in this check." in text
    assert "No runtime was present: nothing to judge." in text


def test_every_figure_is_kept_as_json() -> None:
    found = json.loads(dump(sample()))
    assert found["served"][0]["point"]["row"]["throughput"] == 1800.0
    assert found["memory"][0]["instances"][0]["batch_cap"] == 64
