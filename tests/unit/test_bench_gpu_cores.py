"""The GPU check's request handling across cores, its time budget and its reports in
progress: which worker counts a machine measures, how scaling is judged and shown, and that
a run stopped from outside leaves what it had measured."""

from __future__ import annotations

import urllib.error
from dataclasses import replace
from pathlib import Path

import pytest
from batchserve.models.model_config import CONFIG_FILENAME, load_pbtxt
from batchserve.proto.model_config_pb2 import ModelInstanceGroup

from bench import cpu_split
from bench import workers as workers_bench
from bench.gpu import cores, load, plan, report, run, targets
from bench.gpu import tests as gpu_tests
from bench.gpu.load import LoadTool
from bench.gpu.records import CoresPoint, ExportResult, GpuResults, Key, PytestRun
from bench.gpu.runtimes import BY_KEY
from bench.perf import PaSettings
from bench.workers import Point

PERF_ANALYZER = LoadTool("perf_analyzer", "perf_analyzer")
OWN = LoadTool("bench.gpu.load", "own load")
SIXTEEN_CPUS = cpu_split.split([(cpu, cpu + 8) for cpu in range(8)])
"""A 16-CPU host of 8 hyper-threaded cores, split: the server on 10 CPUs, the load on 6."""


def point(workers: int, protocol: str, throughput: float) -> CoresPoint:
    return CoresPoint(workers, protocol, 32 * workers, throughput, 20.0, 60.0 * (workers > 1))


@pytest.mark.parametrize(
    ("available", "expected"),
    [(2, ()), (4, ()), (7, ()), (8, (1, 2, 4)), (16, (1, 2, 4, 8)), (64, (1, 2, 4, 8))],
)
def test_worker_counts_leave_half_the_cores_to_the_load(
    available: int, expected: tuple[int, ...]
) -> None:
    assert cores.counts(available, dry_run=False) == expected


def test_the_dry_run_measures_one_and_two_workers_on_any_machine() -> None:
    assert cores.counts(2, dry_run=True) == (1, 2)


@pytest.mark.parametrize(
    ("server_cpus", "expected"),
    [(10, (1, 2, 4, 8)), (9, (1, 2, 4, 8)), (8, (1, 2, 4)), (3, (1, 2))],
)
def test_with_cpus_of_its_own_the_server_takes_as_many_workers_as_leave_one_to_the_owner(
    server_cpus: int, expected: tuple[int, ...]
) -> None:
    assert cores.counts(16, dry_run=False, server_cpus=server_cpus) == expected


def test_scaling_is_throughput_over_n_times_one_process_per_protocol() -> None:
    found = [point(1, "grpc", 10_000), point(2, "grpc", 15_000), point(1, "http", 8_000),
             point(4, "grpc", 30_000), point(2, "http", 16_000)]  # fmt: skip
    grpc = [(p.workers, round(share, 3)) for p, share in cores.scaling(found, "grpc")]
    assert grpc == [(1, 1.0), (2, 0.75), (4, 0.75)]
    assert [round(share, 3) for _, share in cores.scaling(found, "http")] == [1.0, 1.0]


def test_the_worst_count_decides_the_verdict() -> None:
    found = [point(1, "grpc", 10_000), point(2, "grpc", 15_000), point(8, "grpc", 50_000)]
    found += [point(1, "http", 10_000), point(2, "http", 19_000), point(8, "http", 60_000)]
    http, grpc = cores.verdicts(found)
    assert grpc.passed is False
    assert grpc.figure == pytest.approx(0.625)
    assert "N=8: 0.62" in grpc.measured
    assert grpc.target.endswith("N = 2..8")
    assert http.passed is True
    assert http.figure == pytest.approx(0.75)


def test_without_one_process_s_figure_nothing_is_judged() -> None:
    verdicts = cores.verdicts([point(2, "grpc", 15_000), point(4, "grpc", 30_000)])
    assert [v.passed for v in verdicts] == [None, None]
    assert [v.measured for v in verdicts] == ["not measured", "not measured"]


def test_the_targets_include_scaling_only_where_it_was_measured() -> None:
    results = GpuResults()
    assert not any("workers" in v.target for v in targets.evaluate(results))
    results.cores = [point(1, "grpc", 10_000), point(2, "grpc", 16_000)]
    judged = [v for v in targets.evaluate(results) if "workers" in v.target]
    assert [v.passed for v in judged] == [None, True]  # HTTP, then gRPC


def test_the_report_shows_each_count_or_why_none_was_measured() -> None:
    results = GpuResults()
    results.cores_note = "2 cores here; it needs 8 or more"
    text = report.render(results, targets.evaluate(results))
    assert "Not measured: 2 cores here; it needs 8 or more." in text
    results.cores = [point(1, "grpc", 10_000), point(2, "grpc", 15_000)]
    results.cores_note = "4 worker(s): the server did not start"
    results.cores_model = "digits_cnn as exported for PyTorch pt2 program, CUDA, FP32, on the GPU"
    text = report.render(results, targets.evaluate(results))
    assert "Model: digits_cnn as exported for PyTorch pt2 program, CUDA, FP32, on the GPU." in text
    assert "| 2 | gRPC | 64 | 15,000 | 0.75 | 20.0 | 60.0 |" in text
    assert "| 1 | gRPC | 32 | 10,000 | 1.00 | 20.0 | (one process) |" in text
    assert "Stopped early: 4 worker(s): the server did not start." in text
    results.cores[1] = replace(results.cores[1], stable=False)
    text = report.render(results, targets.evaluate(results))
    assert "| 2 | gRPC | 64 | 15,000 (unstable) | 0.75 |" in text


@pytest.mark.parametrize("tool", [PERF_ANALYZER, OWN], ids=["perf_analyzer", "own load"])
def test_a_pytorch_only_gpu_machine_with_16_cores_runs_the_judged_case_and_the_cores(
    tool: LoadTool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As on a machine with CUDA PyTorch but neither onnxruntime-gpu nor TensorRT."""
    monkeypatch.setattr(cores, "cores", lambda: 16)
    monkeypatch.setattr(cores, "placement", lambda: SIXTEEN_CPUS)
    check = run.Check(plan.Grid.for_mode(cpu=False), GpuResults(), tmp_path)
    args = run.parse_args([])
    budget = run._budget(check, [BY_KEY["pt2"]], tool, args)
    phases = dict(budget.phases)
    assert phases[run.CORES_PHASE] == cores.planned_s((1, 2, 4, 8), tool.point_s(2.0))
    assert any(c.priority == 0 for c in budget.kept)
    assert budget.total_s <= check.grid.budget_s


def test_with_every_runtime_the_judged_case_runs_past_the_budget_and_the_cores_give_way(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cores, "cores", lambda: 16)
    monkeypatch.setattr(cores, "placement", lambda: SIXTEEN_CPUS)
    check = run.Check(plan.Grid.for_mode(cpu=False), GpuResults(), tmp_path)
    args = run.parse_args([])
    present = [BY_KEY[key] for key in ("ort-cuda", "tensorrt", "pt2")]
    budget = run._budget(check, present, PERF_ANALYZER, args)
    assert dict(budget.phases)[run.CORES_PHASE] == 0.0
    judged = [c for c in budget.kept if c.priority == 0]
    assert sorted(c.key.runtime for c in judged) == ["ort-cuda", "pt2", "tensorrt"]
    assert all(c.priority == 0 for c in budget.kept)
    assert budget.total_s > check.grid.budget_s


def test_cores_only_plans_the_cores_whatever_the_runtimes_and_serves_nothing_else(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--cores-only`` on the machine where the full check gives the cores way: the phase
    is planned, one export per runtime, no in-process or served case, within the budget."""
    monkeypatch.setattr(cores, "cores", lambda: 16)
    monkeypatch.setattr(cores, "placement", lambda: SIXTEEN_CPUS)
    check = run.Check(plan.Grid.for_mode(cpu=False), GpuResults(), tmp_path)
    present = [BY_KEY[key] for key in ("ort-cuda", "tensorrt", "pt2")]
    budget = run._budget(check, present, PERF_ANALYZER, run.parse_args(["--cores-only"]))
    phases = dict(budget.phases)
    assert phases[run.CORES_PHASE] == cores.planned_s((1, 2, 4, 8), PERF_ANALYZER.point_s(2.0))
    assert phases["in-process"] == 0.0
    assert not budget.kept
    assert not budget.dropped
    assert budget.total_s <= check.grid.budget_s


def exported(root: Path, runtime: str, precision: str, ok: bool = True) -> ExportResult:
    """An export's result, with a model directory the way ``batchserve export`` leaves one."""
    name = BY_KEY[runtime].served_name("digits_cnn")
    model_dir = root / f"{runtime}-{precision}" / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / BY_KEY[runtime].filename).write_bytes(b"model")
    (model_dir / CONFIG_FILENAME).write_text(
        f'name: "{name}"\nmax_batch_size: 64\ndynamic_batching {{ }}\n'
    )
    return ExportResult(Key("digits_cnn", runtime, precision), ok, 1.0, str(model_dir))


def test_on_a_gpu_host_the_phase_serves_the_first_gpu_runtime_s_fp32_export_on_the_gpu(
    tmp_path: Path,
) -> None:
    exports = [exported(tmp_path, "ort-cuda", "fp32", ok=False),
               exported(tmp_path, "tensorrt", "fp16"),
               exported(tmp_path, "tensorrt", "fp32"),
               exported(tmp_path, "pt2", "fp32")]  # fmt: skip
    model = cores.served_model(exports, False, tmp_path / "work")
    assert model.name == "digits_cnn_trt"
    assert model.description == (
        "digits_cnn as exported for TensorRT engine, FP32, CUDA graphs, on the GPU"
    )
    config = load_pbtxt(model.repository / model.name / CONFIG_FILENAME)
    assert [g.kind for g in config.instance_group] == [ModelInstanceGroup.KIND_GPU]
    assert config.HasField("dynamic_batching")
    assert config.optimization.cuda.graphs  # a launch cost per batch is not request handling
    assert list(config.optimization.cuda.graph_spec)
    assert (model.repository / model.name / "1" / "model.plan").read_bytes() == b"model"


def test_the_dry_run_serves_a_cpu_export_and_without_one_the_model_as_shipped(
    tmp_path: Path,
) -> None:
    pt2 = cores.served_model([exported(tmp_path, "pt2-cpu", "fp32")], True, tmp_path / "a")
    assert pt2.name == "digits_cnn"
    assert pt2.description.endswith("PyTorch pt2 program, CPU, FP32, on the CPU")
    config = load_pbtxt(pt2.repository / "digits_cnn" / CONFIG_FILENAME)
    assert [g.kind for g in config.instance_group] == [ModelInstanceGroup.KIND_CPU]
    assert not config.HasField("optimization")  # graphs would only be ignored on the CPU
    # a GPU export is no use to the dry run, nor an FP16 one to either
    others = [exported(tmp_path / "b", "pt2", "fp32"), exported(tmp_path / "b", "ort-cpu", "fp16")]
    fallback = cores.served_model(others, True, tmp_path / "c")
    assert fallback.description == "digits_cnn as shipped (ONNX Runtime, on the CPU)"
    shipped_config = load_pbtxt(fallback.repository / "digits_cnn" / CONFIG_FILENAME)
    assert shipped_config.platform == "onnxruntime_onnx"


def test_a_server_that_fails_ends_the_phase_with_the_reason_not_the_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def refused(workers: int, *args: object) -> list[workers_bench.Point]:
        if workers == 1:
            return [workers_bench.Point(1, "digits_cnn", "http", 32, 9_000.0, 90.0, (), True)]
        raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))

    monkeypatch.setattr(workers_bench, "measure", refused)
    found, why = cores.measure((1, 2), PERF_ANALYZER, 1.0, tmp_path)
    assert [(p.workers, p.throughput) for p in found] == [(1, 9_000.0)]
    assert why.startswith("2 worker(s): URLError:")
    assert "Connection refused" in why


def test_the_tests_stop_starting_groups_once_their_time_is_spent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    given: list[float] = []

    def fake_group(group: str, files: list[str], work: Path, timeout_s: float) -> PytestRun:
        given.append(timeout_s)
        return PytestRun(group, passed=1)

    monkeypatch.setattr(gpu_tests, "run_group", fake_group)
    ran = gpu_tests.run(tmp_path, limit_s=100.0)
    assert ran
    assert all(r.passed == 1 for r in ran)
    assert all(0 < t <= 100.0 for t in given)
    skipped = gpu_tests.run(tmp_path, limit_s=0.0)
    assert [r.group for r in skipped] == [r.group for r in ran]
    assert all(r.note == "not run: the tests' 0 s were spent" for r in skipped)


def test_a_report_written_during_the_run_says_so_and_the_last_does_not(tmp_path: Path) -> None:
    out = tmp_path / "GPU_RESULTS.md"
    check = run.Check(plan.Grid.for_mode(cpu=True), GpuResults("cpu"), tmp_path, out)
    with check.phase("exports", 10.0):
        pass
    first = out.read_text()
    assert "Written while the run was under way" in first
    assert "| exports | 10 |" in first
    assert out.with_suffix(".json").exists()
    check.results.finished = True
    run.write(out, check.results)
    assert "Written while the run was under way" not in out.read_text()


def test_the_phase_asks_for_a_connection_per_client_and_keeps_machine_load_and_frames(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked: list[PaSettings] = []

    def measured(workers: int, repo: Path, settings: PaSettings, *args: object) -> list[Point]:
        asked.append(settings)
        return [Point(workers, "digits_cnn", p, 32, 9_000.0, 90.0, (50.0,) * (workers > 1),
                      True, 0.25 * workers, 1, 70.0 * workers, 6.5 * (workers > 1))
                for p in cores.PROTOCOLS]  # fmt: skip

    monkeypatch.setattr(workers_bench, "measure", measured)
    found, why = cores.measure((1, 2), PERF_ANALYZER, 1.0, tmp_path)
    assert why == ""
    assert all(settings.grpc_connection_per_client for settings in asked)
    assert [(p.workers, p.machine_busy, p.load_us, p.per_frame) for p in found] == [
        (1, 0.25, 70.0, 0.0),
        (1, 0.25, 70.0, 0.0),
        (2, 0.5, 140.0, 6.5),
        (2, 0.5, 140.0, 6.5),
    ]
    text = report._cores(GpuResults(cores=found))
    assert "| machine busy | requests per frame |" in text
    assert "| 140 | 50% | 6.5 |" in text
    assert "| 70 | 25% | — |" in text
    assert "load generator µs CPU/request" in text
    assert "each gRPC client on a connection of its own" in text


def test_the_own_load_tool_opens_a_connection_per_client_when_the_settings_ask() -> None:
    asked = load.command(
        "m", "grpc", "127.0.0.1:1", 8, PaSettings(2000, grpc_connection_per_client=True)
    )
    assert "--grpc-connection-per-client" in asked
    assert asked[asked.index("--window-s") + 1] == "2"
    assert "--grpc-connection-per-client" not in load.command(
        "m", "grpc", "127.0.0.1:1", 8, PaSettings(2000)
    )


def test_the_server_and_the_load_run_on_their_own_cpus_and_the_report_says_how_busy_each_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked: list[tuple[PaSettings, tuple[int, ...]]] = []

    def measured(
        workers: int, repo: Path, settings: PaSettings, work: Path, points: object,
        driver: object, extra: object, cpus: tuple[int, ...] = (),
    ) -> list[Point]:  # fmt: skip
        asked.append((settings, tuple(cpus)))
        return [Point(workers, "digits_cnn", p, 32, 9_000.0, 90.0, (50.0,) * (workers > 1),
                      True, 0.5, 1, 70.0, 0.0, 0.95, 0.4)
                for p in cores.PROTOCOLS]  # fmt: skip

    monkeypatch.setattr(workers_bench, "measure", measured)
    assert SIXTEEN_CPUS is not None
    found, why = cores.measure((1, 2), PERF_ANALYZER, 1.0, tmp_path, cpus=SIXTEEN_CPUS)
    assert why == ""
    assert [(s.cpus, cpus) for s, cpus in asked] == [(SIXTEEN_CPUS.load, SIXTEEN_CPUS.server)] * 2
    assert {(p.server_busy, p.load_busy) for p in found} == {(0.95, 0.4)}
    text = report._cores(GpuResults(cores=found, cores_cpus=SIXTEEN_CPUS.describe()))
    assert "CPUs: the server on CPUs 0-4,8-12 (5 physical cores), the load generator" in text
    assert "| requests per frame | server / load busy |" in text
    assert text.count("| 95% / 40% |") == 4
    shared = report._cores(GpuResults(cores=found))
    assert "CPUs: the server and the load generator shared every CPU." in shared


def test_without_cpus_of_its_own_the_load_runs_anywhere_and_the_own_tool_takes_half(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked: list[tuple[PaSettings, tuple[int, ...], list[str]]] = []

    def measured(
        workers: int, repo: Path, settings: PaSettings, work: Path, points: object,
        driver: object, extra: dict[str, list[str]], cpus: tuple[int, ...] = (),
    ) -> list[Point]:  # fmt: skip
        asked.append((settings, tuple(cpus), extra["digits_cnn"]))
        return []

    monkeypatch.setattr(workers_bench, "measure", measured)
    monkeypatch.setattr(cores, "cores", lambda: 16)
    cores.measure((1,), OWN, 1.0, tmp_path)
    assert SIXTEEN_CPUS is not None
    cores.measure((1,), OWN, 1.0, tmp_path, cpus=SIXTEEN_CPUS)
    (anywhere, _, shared_extra), (pinned, server, own_extra) = asked
    assert (anywhere.cpus, pinned.cpus, server) == ((), SIXTEEN_CPUS.load, SIXTEEN_CPUS.server)
    assert shared_extra[-2:] == ["--procs", "8"]
    assert own_extra[-2:] == ["--procs", "6"]


@pytest.mark.parametrize(
    ("busy", "expected"),
    [
        ({"loop_busy": 0.95, "busiest_worker": 0.97}, "the model-owning process's event loop"),
        ({"loop_busy": 0.6, "busiest_worker": 0.93}, "the busiest worker"),
        ({"loop_busy": 0.6, "busiest_worker": 0.5, "server_busy": 0.92}, "the server's CPUs"),
        ({"loop_busy": 0.6, "busiest_worker": 0.5, "load_busy": 0.91},
         "the load generator's CPUs"),
        ({"loop_busy": 0.6, "busiest_worker": 0.5, "machine_busy": 0.95}, "the machine's CPUs"),
        ({"loop_busy": 0.6, "busiest_worker": 0.5}, "nothing saturated: latency"),
    ],
)  # fmt: skip
def test_each_point_names_what_set_its_throughput(busy: dict[str, float], expected: str) -> None:
    assert cores.bound(replace(point(8, "http", 24_000.0), **busy)) == expected


def test_one_process_is_its_own_bound_once_its_cpu_per_request_fills_a_core() -> None:
    one = point(1, "http", 5_000.0)  # 20 µs a request: a tenth of a core
    assert cores.bound(one) == "nothing saturated: latency"
    assert cores.bound(replace(one, owner_us=190.0)) == "the one process"


def test_the_report_shows_the_loop_the_busiest_worker_latency_and_batch_of_each_point() -> None:
    found = [
        point(1, "http", 5_000.0),
        replace(
            point(8, "http", 24_000.0),
            loop_busy=0.97,
            busiest_worker=0.52,
            p50_ms=10.44,
            mean_batch=31.25,
        ),
    ]
    text = report._cores(GpuResults(cores=found))
    assert "| owner's event loop busy | busiest worker busy | p50 ms | mean batch | bound by |" in (
        text
    )
    assert "| 0.97 | 0.52 | 10.44 | 31.2 | the model-owning process's event loop |" in text
    assert "| — | — | — | — | nothing saturated: latency |" in text  # a record from before
