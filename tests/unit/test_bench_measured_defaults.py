"""bench.measured_defaults: the configs it serves, the order of its paired rounds, and what
its report judges (perf_analyzer, the servers and the in-process session are recorders here)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from batchserve.core.datatypes import BY_WIRE
from batchserve.models.measured_defaults import wants_tuning
from batchserve.models.model_config import load_pbtxt

from bench import ceiling, measured_defaults, repo, run, servers
from bench.inputs import ModelInputs, Sample
from bench.measured_report import (
    MEASURED,
    OLD,
    TUNED,
    Choice,
    Run,
    dump,
    light_pairs,
    load,
    render,
    served,
    verdicts,
)
from bench.records import BATCHSERVE, CeilingPoint, PaRow, Results, ServerPoint

ROOT = Path(__file__).resolve().parents[2]
STATS = {
    "name": "vgg192ish",
    "batchserve": {
        "batch_cap": 64,
        "measured_defaults": {
            "chosen": {"instances": 2, "threads": 1, "cuda_graphs": False, "cpu_instances": 0,
                       "samples_per_second": 0.0, "error": ""},
            "reason": "measured 1.12x the default's throughput",
            "seconds": 3.5,
            "measured": [
                {"instances": 1, "threads": 0, "cuda_graphs": False, "cpu_instances": 0,
                 "samples_per_second": 40.0, "error": ""},
                {"instances": 2, "threads": 1, "cuda_graphs": False, "cpu_instances": 0,
                 "samples_per_second": 44.8, "error": ""},
            ],
        },
    },
}  # fmt: skip


def test_the_choice_is_read_from_the_statistics_in_the_servers_own_words() -> None:
    choice = Choice.from_stats(STATS)
    assert choice == Choice(
        "2 instance(s) x 1 thread(s)",
        "measured 1.12x the default's throughput",
        3.5,
        (("1 instance(s) x runtime threads", 40.0, ""), ("2 instance(s) x 1 thread(s)", 44.8, "")),
    )
    assert Choice.from_stats({"batchserve": {"batch_cap": 64}}) is None


def test_each_config_is_a_copy_whose_threads_and_counts_are_removed(tmp_path: Path) -> None:
    source = ROOT / "model_repo" / "digits_cnn"  # ships intra_op_thread_count: 1
    assert not wants_tuning(load_pbtxt(source / "config.pbtxt"))
    copy = measured_defaults.configured_copy(source, tmp_path, "digits_cnn")
    old = measured_defaults.configured_copy(source, tmp_path, served("digits_cnn", OLD), count=1)

    measured = load_pbtxt(copy / "config.pbtxt")
    assert measured_defaults.measures_at_load(copy) == copy
    assert not measured.parameters
    assert not measured.instance_group
    assert measured.HasField("dynamic_batching")
    config = load_pbtxt(old / "config.pbtxt")
    assert config.name == "digits_cnn_old_default"
    assert [g.count for g in config.instance_group] == [1]
    assert not config.parameters
    assert (old / "1" / "model.onnx").read_bytes() == (source / "1" / "model.onnx").read_bytes()
    assert not (old / "configs").exists()  # named configs would set counts of their own
    with pytest.raises(SystemExit, match="sets instances or threads"):
        measured_defaults.measures_at_load(old)


def _subject(tmp_path: Path, name: str) -> run.Subject:
    sample = Sample("image", BY_WIRE["FP32"], np.zeros(4, dtype=np.float32), free_axes=False)
    (tmp_path / name).mkdir()
    return run.Subject(name, tmp_path / name, None, ModelInputs(name, True, (sample,)))


def _bench(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rounds: int
) -> tuple[measured_defaults.Bench, list[str]]:
    """A bench whose server, perf_analyzer and ceiling log what they were asked for."""
    plan = run.Plan(False, (16, 32), (1, 8), 0.1, 1000, 0.0, rounds)
    results = Results()
    results.ceilings.append(CeilingPoint("m", 8, 0.2, 5))
    taken: list[str] = []

    @contextmanager
    def batchserve(repository: Path, model: str, also: Any = ()) -> Iterator[Any]:
        taken.append(f"serve {' '.join([model, *also])}")
        yield servers.Running(BATCHSERVE, cast(Any, None), {"http": 1, "grpc": 2})

    def measure(running: Any, model: str, protocol: str, c: int, *rest: Any) -> ServerPoint:
        taken.append(f"{model} {protocol} c={c}")
        return ServerPoint(BATCHSERVE, model, protocol, c, rest[0], PaRow(38.0, 1, 2, 0, 0))

    def in_process(model_file: Path, inputs: ModelInputs, batches: Any, *_: Any, **__: Any) -> Any:
        taken.append(f"ceiling b={batches[0]}")
        return [CeilingPoint(inputs.model, batches[0], 0.2, 5)]

    monkeypatch.setattr(servers, "batchserve", batchserve)
    monkeypatch.setattr(servers, "measure", measure)
    monkeypatch.setattr(ceiling, "measure", in_process)
    monkeypatch.setattr(repo, "onnx_file", lambda directory: directory / "model.onnx")
    monkeypatch.setattr(measured_defaults, "model_stats", lambda port, name: STATS)
    bench = measured_defaults.Bench(run.Runner(plan, tmp_path, results), Run(results))
    return bench, taken


def test_a_cnn_serves_three_configs_each_point_right_after_the_ceiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench, taken = _bench(tmp_path, monkeypatch, rounds=2)
    bench.cnn_rounds(_subject(tmp_path, "m"))

    configs = ["m_old_default", "m", "m_hand_tuned"]
    assert taken[0] == "serve m m_old_default m_hand_tuned"  # the measured one loads first
    pairs = [["ceiling b=8", f"{name} grpc c=16"] for name in [*configs, *configs[::-1]]]
    assert taken[1:] == [step for pair in pairs for step in pair]
    ceilings = [(c.beside, c.round) for c in bench.results.ceilings if c.beside]
    assert ceilings == [(name, r) for r, order in enumerate([configs, configs[::-1]])
                        for name in order]  # fmt: skip
    assert set(bench.figures.choices) == set(configs)


def test_a_light_model_and_its_old_default_take_turns_at_each_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench, taken = _bench(tmp_path, monkeypatch, rounds=2)
    bench.light_rounds(_subject(tmp_path, "m"))

    assert taken[0] == "serve m m_old_default"
    turns = ["m_old_default {}", "m {}", "m {}", "m_old_default {}"]
    expected = [t.format(p) for p in ("grpc c=16", "http c=32") for t in turns]
    assert taken[1:] == expected
    assert "ceiling" not in " ".join(taken)


def _point(model: str, protocol: str, c: int, speed: float | None, round_: int) -> ServerPoint:
    row = PaRow(speed, 1000, 2000, 0, 0) if speed is not None else None
    error = "" if row else "perf_analyzer did not finish within 90 s"
    return ServerPoint(BATCHSERVE, model, protocol, c, "on", row, round=round_, error=error)


def _run() -> Run:
    """vgg: measured at 0.96 / 0.90 / 1.00 of the ceiling beside it; digits: gRPC within
    noise of the old default, HTTP 5 % slower in two rounds out of three."""
    results = Results(header=["Machine: test"], command="python -m bench.measured_defaults")
    results.ceilings.append(CeilingPoint("vgg", 16, 0.4, 6))  # the section's best: 40/s
    for round_, (ceiling_rate, speeds) in enumerate(
        [(50.0, (40.0, 48.0, 52.0)), (40.0, (35.0, 36.0, 42.0)), (45.0, (40.0, 45.0, 46.0))]
    ):
        for variant, speed in zip((OLD, MEASURED, TUNED), speeds, strict=True):
            name = served("vgg", variant)
            beside = CeilingPoint("vgg", 16, 16 / ceiling_rate, 6, name, "grpc", round_)
            results.ceilings.append(beside)
            results.points.append(_point(name, "grpc", 16, speed, round_))
    for round_, (old, new) in enumerate([(1000.0, 990.0), (1000.0, 1010.0), (1000.0, 1000.0)]):
        results.points.append(_point("digits_old_default", "grpc", 16, old, round_))
        results.points.append(_point("digits", "grpc", 16, new, round_))
    for round_, (before, after) in enumerate([(2000.0, 1900.0), (2000.0, 1900.0), (2000.0, None)]):
        results.points.append(_point("digits_old_default", "http", 32, before, round_))
        results.points.append(_point("digits", "http", 32, after, round_))
    choices = {"vgg": Choice.from_stats(STATS), "digits": None}
    return Run(results, ["vgg"], ["digits"], choices, cores=2)


def test_light_rounds_pair_by_round_and_skip_a_failed_point() -> None:
    pairs = light_pairs(_run().results, "digits", "http", 32)
    assert [(p.point.round, p.reference, p.ratio) for p in pairs] == [
        (0, 2000.0, 0.95), (1, 2000.0, 0.95)
    ]  # fmt: skip


def test_targets_take_the_median_round() -> None:
    found = {v.target: v for v in verdicts(_run())}
    cnn = found["vgg gRPC c=16, measured default >= 0.95 x ceiling"]
    assert cnn.rounds == (0.96, 0.9, 1.0)
    assert cnn.passed is True
    assert cnn.figure == 0.96
    assert "(b=16)" in cnn.measured
    grpc = found["digits gRPC c=16, measured default >= 0.97 x old default (within noise)"]
    assert (grpc.passed, grpc.figure) == (True, 1.0)
    http = found["digits HTTP c=32, measured default >= 0.97 x old default (within noise)"]
    assert (http.passed, http.figure) == (False, 0.95)


def test_a_model_never_measured_is_not_judged() -> None:
    empty = Run(Results(), ["vgg"], ["digits"])
    assert {v.label for v in verdicts(empty)} == {"not measured"}


def test_the_report_shows_choices_ratios_and_verdicts_and_renders_again_from_json() -> None:
    figures = _run()
    text = render(figures, verdicts(figures))

    assert text.startswith("# Measured defaults")
    assert "| vgg | 2 instance(s) x 1 thread(s) | measured 1.12x the default's throughput |" in text
    assert "1 instance(s) x runtime threads: 40.0/s; 2 instance(s) x 1 thread(s): 44.8/s" in text
    assert "| digits | not measured: the config set instances or threads |" in text
    # old, measured and hand-tuned over the ceiling: medians and ranges over three rounds
    assert "| vgg | 40.0 (b=16) | 0.88 (0.80-0.89) | 0.96 (0.90-1.00) | 1.04 (1.02-1.05) |" in text
    assert "| vgg | measured default | 2 | 40.0 (16) | 36.0 | 0.90 |" in text
    assert "| digits | HTTP c=32 | 2,000 | 1,900 | 0.95 (0.95-0.95) |" in text
    assert "**FAIL**" in text
    assert "**PASS**" in text
    assert "Failed: digits HTTP c=32 round 3: perf_analyzer did not finish within 90 s" in text
    assert load(dump(figures)) == figures


def test_a_failed_point_names_its_own_error_not_another_configs() -> None:
    results = Results()
    results.points.append(_point("vgg_old_default", "grpc", 16, None, 0))
    results.points.append(replace(_point("vgg", "grpc", 16, None, 0), error="no valid requests"))
    found = verdicts(Run(results, ["vgg"]))
    assert [v.measured for v in found] == ["point failed: no valid requests"]


def test_the_notes_say_how_points_were_taken_with_this_runs_windows() -> None:
    plan = run.Plan(False, (16, 32), (1, 8), 2.0, 3000, 60.0, 3)
    results = Results(shipped={"vgg": "on", "digits": "on"})
    results.ceilings.append(CeilingPoint("vgg", 1, 0.03, 5))  # 30 ms a call: longer windows
    notes = measured_defaults.method_notes(plan, results)
    assert notes[0].startswith("Ceiling: one ONNX Runtime session per model")
    assert "W = 3000 ms, 6000 ms for vgg" in notes[1]
    assert notes[2].startswith("Rounds: 3.")
