"""The GPU check's grid and time budget: which cases run, in what order, and what is dropped."""

from __future__ import annotations

from dataclasses import replace

from bench.gpu import plan
from bench.gpu.records import DIGITS, RESNET, Key, Variant
from bench.gpu.run import export_keys
from bench.gpu.runtimes import BY_KEY, ORT_CUDA, PT2_CUDA, TENSORRT
from bench.gpu.variants import batch_sizes

GPU = plan.Grid.for_mode(cpu=False)
CPU = plan.Grid.for_mode(cpu=True)


def test_the_gpu_grid_spans_the_issue() -> None:
    assert GPU.concurrency == (1, 4, 16, 64, 256)
    assert GPU.batches == (1, 2, 4, 8, 16, 32, 64)
    assert GPU.image_size == 224


def test_a_gpu_run_fits_a_ten_minute_command_with_its_set_up() -> None:
    assert GPU.budget_s == plan.GPU_BUDGET_S <= 8 * 60


def test_the_dry_run_is_tiny() -> None:
    assert CPU.concurrency == (1, 4)
    assert CPU.batches == (1, 2, 4, 8)
    assert CPU.image_size < GPU.image_size


def test_batch_sizes_are_powers_of_two_and_the_maximum() -> None:
    assert batch_sizes(1) == (1,)
    assert batch_sizes(48) == (1, 2, 4, 8, 16, 32, 48)


def test_the_judged_case_comes_first_on_every_runtime_with_every_concurrency() -> None:
    found = plan.cases(["ort-cuda", "tensorrt"], GPU)
    first = [c for c in found if c.priority == 0]
    assert [c.key for c in first] == [
        Key(RESNET, "ort-cuda", "fp16"),
        Key(RESNET, "tensorrt", "fp16"),
    ]
    assert all(c.variant == plan.JUDGED and c.concurrency == GPU.concurrency for c in first)
    assert [c.priority for c in found] == sorted(c.priority for c in found)


def test_every_variant_and_precision_is_planned() -> None:
    found = plan.cases(["pt2"], GPU)
    variants = {c.variant for c in found}
    assert variants == {
        Variant(True, False),
        Variant(True, True),
        Variant(False, False),
    }
    assert {c.key.precision for c in found} == {"fp32", "fp16"}
    assert {c.key.model for c in found} == {DIGITS, RESNET}
    judged = [c for c in found if c.variant == plan.JUDGED and c.key.precision == "fp16"]
    assert all(c.protocols == ("http", "grpc") for c in judged)
    assert all(c.protocols == ("grpc",) for c in found if c not in judged)


def test_subsets_keep_the_grid_s_concurrencies() -> None:
    assert GPU.subset((1, 16, 256)) == (1, 16, 256)
    assert CPU.subset((16, 64)) == (1, 4)  # none of them: its smallest and largest


def test_keys_cover_each_network_runtime_and_precision() -> None:
    keys = plan.keys(["ort-cuda", "pt2"])
    assert len(keys) == 2 * 2 * 2
    assert Key(DIGITS, "pt2", "fp32") in keys


def test_a_cores_only_run_exports_only_the_digits_cnn_it_serves_at_fp32() -> None:
    """``--cores-only``: one export per runtime, the one request handling across cores
    serves (``cores.served_model``), so that the phase fits a few minutes' loan."""
    present = [BY_KEY["ort-cuda"], BY_KEY["pt2"]]
    assert export_keys(present, cores_only=True) == [
        Key(DIGITS, "ort-cuda", "fp32"), Key(DIGITS, "pt2", "fp32"),
    ]  # fmt: skip
    assert export_keys(present, cores_only=False) == plan.keys(["ort-cuda", "pt2"])


def test_everything_fits_a_generous_budget() -> None:
    candidates = plan.cases(["ort-cuda"], GPU)
    budget = plan.fit([("tests", 60.0)], candidates, replace(GPU, budget_s=10_000), 5.0)
    assert budget.kept == tuple(candidates)
    assert budget.dropped == ()
    assert budget.phases[0] == ("tests", 60.0)
    assert budget.total_s == 60.0 + sum(plan.case_s(c, GPU, 5.0) for c in candidates)


def test_a_tight_budget_drops_the_lowest_priorities_on_every_runtime_alike() -> None:
    candidates = plan.cases(["ort-cuda", "tensorrt", "pt2"], GPU)
    judged = [c for c in candidates if c.priority == 0]
    room = sum(plan.case_s(c, GPU, 5.0) for c in judged) + 1
    budget = plan.fit([("exports", 100.0)], candidates, replace(GPU, budget_s=100.0 + room), 5.0)
    assert list(budget.kept) == judged
    assert len(budget.dropped) == len(candidates) - len(judged)
    assert budget.total_s <= 100.0 + room


def test_the_judged_level_is_kept_even_past_the_budget() -> None:
    candidates = plan.cases(["ort-cuda", "pt2"], GPU)
    budget = plan.fit([("exports", 100.0)], candidates, replace(GPU, budget_s=50.0), 5.0)
    assert [c.priority for c in budget.kept] == [0, 0]
    assert budget.total_s == 100.0 + plan.judged_s(candidates, GPU, 5.0)
    assert len(budget.dropped) == len(candidates) - 2


def test_a_case_s_cost_is_its_start_and_its_points() -> None:
    case = plan.Case(Key(RESNET, "tensorrt", "fp16"), plan.JUDGED, (1, 16), 0)
    assert case.points == 4
    assert plan.case_s(case, GPU, 3.0) == plan.case_s(case, GPU, 0.0) + 12.0


def test_engine_builds_are_planned_longer_than_onnx_exports() -> None:
    key = Key(RESNET, "tensorrt", "fp16")
    assert plan.export_s(key, "plan", GPU) > plan.export_s(key, "onnx", GPU)
    assert plan.export_s(key, "onnx", CPU) < plan.export_s(key, "onnx", GPU)


def test_the_budget_is_printed_with_its_limit_and_what_was_dropped() -> None:
    candidates = plan.cases(["ort-cuda"], GPU)
    budget = plan.fit([("GPU tests", 300.0)], candidates, replace(GPU, budget_s=320.0), 5.0)
    lines = plan.budget_lines(budget, GPU)
    assert lines[0].split() == ["GPU", "tests", "300", "s"]
    assert any(f"total (limit {GPU.budget_s:.0f} s)" in line for line in lines)
    assert any(
        line.strip().startswith("dropped to fit: resnet50ish ort-cuda fp16") for line in lines
    )


def test_runtimes_export_fp16_as_their_users_would() -> None:
    assert TENSORRT.export_flags("fp16") == ["--tensorrt", "--fp16"]
    assert not TENSORRT.half_module("fp16")
    assert ORT_CUDA.export_flags("fp16") == []
    assert ORT_CUDA.half_module("fp16")
    assert PT2_CUDA.export_flags("fp32") == ["--format", "pt2"]
    assert not PT2_CUDA.half_module("fp32")
    assert TENSORRT.served_name(RESNET) == "resnet50ish_trt"
    assert BY_KEY["ort-cpu"].device == "cpu"
