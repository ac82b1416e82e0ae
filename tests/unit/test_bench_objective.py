"""bench.objective's pure parts: the Poisson schedule, the share and goodput of a window, the
configs it loads, and the targets judged from its figures."""

from __future__ import annotations

import collections
import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from batchserve.models.model_config import CONFIG_FILENAME, load_pbtxt
from batchserve.models.repository import ModelRepository
from batchserve.proto.model_config_pb2 import ModelConfig
from google.protobuf import json_format

from bench.objective import (
    OPEN_STEPS,
    config_order,
    copy_name,
    kept_up,
    open_share,
    override,
    scratch_repository,
    settle,
)
from bench.objective_report import (
    BY_DUE,
    CONFIGS,
    DELAY_0,
    ECHO,
    HALF,
    OBJECTIVE,
    SHIPPED,
    Cell,
    Report,
    dump,
    load,
    pooled,
    render,
    rounds_won,
    targets,
)
from bench.open_loop import (
    Figures,
    Sample,
    intervals_us,
    judge,
    judged_span,
    poisson_schedule,
    samples_from_export,
    unanswered,
)
from bench.servers import Counts, counts_from_stats

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"


def test_the_schedule_is_poisson_at_the_rate_asked_and_the_same_for_a_seed() -> None:
    times = poisson_schedule(2000.0, 20.0, seed=3)
    assert times == poisson_schedule(2000.0, 20.0, seed=3)
    assert times != poisson_schedule(2000.0, 20.0, seed=4)
    assert all(0 < a < b < 20.0 for a, b in itertools.pairwise(times))
    assert abs(len(times) / 20.0 - 2000) < 2000 * 0.02  # 40,000 arrivals: within 2 %
    gaps = [b - a for a, b in itertools.pairwise(times)]
    mean = sum(gaps) / len(gaps)
    spread = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps))
    assert abs(spread / mean - 1) < 0.03  # exponential gaps: standard deviation = mean


def test_perf_analyzer_plays_the_schedule_as_gaps_in_whole_microseconds() -> None:
    times = [0.0000004, 0.001, 0.0010004, 0.0025]
    gaps = intervals_us(times)
    assert gaps == [1, 999, 1, 1499]  # never 0; rounding does not drift
    assert sum(gaps) == 2500


def test_share_and_goodput_count_the_requests_due_in_the_span() -> None:
    nan = math.nan
    samples = [
        Sample(0.5, 0.5, 0.001),  # due before the span
        Sample(1.0, 1.0, 0.002),  # within a 3 ms objective
        Sample(1.5, 1.5004, 0.003),  # exactly at it: within
        Sample(2.0, 2.0, 0.004),  # late
        Sample(2.5, 2.5, nan),  # no answer: offered, not within
        Sample(2.9, 3.2, 0.001),  # sent after the span ended: still its request
        Sample(3.0, 3.0, 0.001),  # the span's end is outside it
    ]
    figures = judge(samples, 0.003, 1.0, 3.0)
    assert (figures.requests, figures.within, figures.failed) == (5, 3, 1)
    assert figures.share == 3 / 5
    assert figures.goodput == 3 / 2.0  # per second of the span
    assert figures.offered == 5 / 2.0
    assert figures.sent == 4
    assert figures.sent_rate == 4 / 2.0
    assert math.isclose(figures.p50_ms, 2.5)
    assert math.isclose(figures.lag_p99_ms, 288.0, rel_tol=0.01)  # the 300 ms late send


def test_two_runs_of_one_schedule_are_judged_on_the_same_requests() -> None:
    """perf_analyzer's windows run a little longer than asked, by a different amount each
    run: judged by when they were sent, two runs that answered every request in time would
    count a few more or fewer, and so differ in goodput."""
    due = poisson_schedule(1000.0, 20.0, seed=5)
    start_s, end_s = judged_span(5.0)
    assert (start_s, end_s) == (5.0, 15.0)  # one window of warm-up, then two
    ran = []
    for late_s in (0.0, 0.004):  # the second run's sends a few ms behind, all in time
        samples = [Sample(at - due[0], at - due[0] + late_s, 0.001) for at in due]
        ran.append(judge(samples, 0.002, start_s, end_s))
    assert ran[0].requests == ran[1].requests == sum(1 for at in due if 5 <= at - due[0] < 15)
    assert ran[0].goodput == ran[1].goodput
    assert ran[0].share == 1.0


def test_the_export_gives_each_request_its_latency_and_its_lag_behind_the_schedule() -> None:
    ms = 1_000_000
    export = {
        "experiments": [{
            "requests": [  # perf_analyzer's threads write them out of order
                {"timestamp": 1000 * ms + 5 * ms, "response_timestamps": []},
                {"timestamp": 1000 * ms, "response_timestamps": [1000 * ms + 2 * ms]},
                {"timestamp": 1000 * ms + 2 * ms, "response_timestamps": [1000 * ms + 3 * ms]},
            ],
            "window_boundaries": [1000 * ms, 1004 * ms, 1008 * ms],
        }]
    }  # fmt: skip
    samples = samples_from_export(export, [0.010, 0.011, 0.014, 0.020])
    assert [s.sent_s for s in samples][:3] == [0.0, 0.002, 0.005]
    assert [s.latency_s for s in samples][:2] == [0.002, 0.001]
    assert math.isnan(samples[2].latency_s)
    assert [round(s.lag_s, 6) for s in samples][:3] == [0.0, 0.001, 0.001]
    never = samples[3]  # due, but the run ended before it was sent
    assert round(never.due_s, 6) == 0.010
    assert math.isnan(never.sent_s)
    assert math.isnan(never.latency_s)
    figures = judge(samples, 0.003, 0.0, 0.015)
    assert (figures.requests, figures.within, figures.failed, figures.sent) == (4, 2, 2, 3)


def _config(json_text: str) -> ModelConfig:
    return json_format.Parse(json_text, ModelConfig())


def test_the_three_configs_differ_only_in_objective_and_queue_delay() -> None:
    shipped = load_pbtxt(MODEL_REPO / "digits_cnn" / CONFIG_FILENAME)
    delay = shipped.dynamic_batching.max_queue_delay_microseconds
    mine = _config(override(shipped, OBJECTIVE, 1500))
    assert mine.name == "digits_cnn_objective"  # the copy that serves it
    assert mine.batchserve.latency_objective_microseconds == 1500
    assert not mine.batchserve.refuse_late_requests  # perf_analyzer stops at a refusal
    assert mine.dynamic_batching.max_queue_delay_microseconds == delay  # as shipped
    zero, half = (_config(override(shipped, c, 1500)) for c in (DELAY_0, HALF))
    for fixed, wanted in ((zero, 0), (half, 750)):
        expected = ModelConfig()
        expected.CopyFrom(shipped)  # no objective: the shipped config has none
        expected.dynamic_batching.max_queue_delay_microseconds = wanted
        expected.name = fixed.name
        assert fixed == expected
    assert (zero.name, half.name) == ("digits_cnn_delay0", "digits_cnn_half")
    assert _config(override(shipped, SHIPPED, 1500)) == shipped  # the capacity's, unchanged


def test_the_scratch_repository_holds_the_model_and_a_named_copy_for_each_config(
    tmp_path: Path,
) -> None:
    source = MODEL_REPO / "digits_cnn"
    repository = scratch_repository(source, tmp_path)
    names = sorted(path.name for path in repository.iterdir())
    assert names == sorted(["digits_cnn", *(copy_name("digits_cnn", c) for c in CONFIGS)])
    shipped = load_pbtxt(source / CONFIG_FILENAME)
    for name in names:
        config = load_pbtxt(repository / name / CONFIG_FILENAME)
        assert config.name == name
        config.name = shipped.name
        assert config == shipped  # only the name differs until a config is loaded into it
        model = repository / name / "1" / "model.onnx"
        assert model.read_bytes() == (source / "1" / "model.onnx").read_bytes()
    resolved = ModelRepository(repository).resolve(copy_name("digits_cnn", HALF))
    assert resolved.config.name == "digits_cnn_half"  # the server accepts the copy as named


def _figures(within: int, requests: int = 100) -> Figures:
    return Figures(requests, within, 0, 1.0, 1.0, 2.0, 0.1)


def _report(within: dict[tuple[float, str], int]) -> Report:
    cells = [
        Cell(3, 1500, load, config, 0, _figures(count), 12.0)
        for (load, config), count in within.items()
    ]
    return Report(model="m", cells=cells, capacity=1000.0, batch1_ms=0.5, window_s=1.0)


def test_the_targets_are_the_share_at_80_percent_and_goodput_against_the_better_fixed_delay() -> (
    None
):
    report = _report({
        (0.5, OBJECTIVE): 100, (0.5, DELAY_0): 100, (0.5, HALF): 90,
        (0.8, OBJECTIVE): 99, (0.8, DELAY_0): 60, (0.8, HALF): 98,
        (0.95, OBJECTIVE): 70, (0.95, DELAY_0): 40, (0.95, HALF): 71,
    })  # fmt: skip
    verdicts = [ok for _, ok in targets(report)]
    assert verdicts == [True, True, True, False]  # 99 % at 80 %; 70 < 71 at 95 %
    report.cells[3] = Cell(3, 1500, 0.8, OBJECTIVE, 0, _figures(98), 12.0)
    assert [ok for _, ok in targets(report)] == [False, True, True, False]


def test_rounds_won_compare_the_configs_within_each_round_the_pooled_verdict_over_all() -> None:
    report = Report(model="m", capacity=1000.0, batch1_ms=0.5, window_s=1.0)
    played = {  # round: within of 100, per config
        0: {OBJECTIVE: 90, DELAY_0: 80, HALF: 85},  # won
        1: {OBJECTIVE: 70, DELAY_0: 70, HALF: 60},  # a tie counts as won
        2: {OBJECTIVE: 10, DELAY_0: 95, HALF: 20},  # one bad round
        3: {OBJECTIVE: 50, DELAY_0: 60},  # HALF never ran: not compared
    }
    for round_, shares in played.items():
        for config, within in shares.items():
            report.cells.append(Cell(3, 1500, 0.8, config, round_, _figures(within), 4.0))
    assert rounds_won(report, 3, 0.8) == (2, 3)
    text, ok = targets(report)[1]
    assert "round by round: 2 of 3" in text
    assert not ok  # pooled, the bad round decides: 220 within in 4 s against 305


def test_rounds_pool_into_one_window_and_the_report_survives_json() -> None:
    report = _report({(0.8, c): 100 for c in CONFIGS})
    report.cells.append(Cell(3, 1500, 0.8, OBJECTIVE, 1, _figures(50), 20.0, planned=0.25))
    both = pooled(report.rounds(3, 0.8, OBJECTIVE))
    assert (both.requests, both.within, both.seconds) == (200, 150, 2.0)
    assert both.share == 0.75
    assert both.goodput == 75.0
    report.open_share, report.open_steps = 0.6, [(0.6, 40.0, 590.0), (0.7, 900.0, 700.0)]
    again = load(dump(report))
    assert again == report
    assert "| 80% | 0 | objective | 100 | 75.00% | 75 |" in render(again)
    (objective_row,) = [r for r in render(again).splitlines() if "| objective |" in r]
    assert "| 16.0 | 25% |" in objective_row  # mean batch, then the rounds that counted plans
    (delay_row,) = [r for r in render(again).splitlines() if "| delay 0 |" in r]
    assert "| 12.0 |  |" in delay_row  # a fixed delay plans nothing
    older = json.loads(dump(again))
    for cell in older["cells"]:
        del cell["planned"]  # a report from before plans were counted
    assert {c.planned for c in load(json.dumps(older)).cells} == {None}
    assert "kept up with 60% (" in render(again)
    assert "70%: p99 900.0 ms at 700/s sent" in render(again)
    assert "two 1 s windows judged after one of warm-up" in render(again)  # runs from before
    by_due = load(dump(replace(again, judged=BY_DUE)))
    assert "the requests the schedule has due from 1 s to 3 s judged" in render(by_due)


def test_the_echo_is_a_reference_row_beside_the_configs_and_never_a_config_judged() -> None:
    report = _report({
        (0.8, OBJECTIVE): 90, (0.8, DELAY_0): 95, (0.8, HALF): 80, (0.8, ECHO): 97,
    })  # fmt: skip
    assert rounds_won(report, 3, 0.8) == (0, 1)  # against the fixed delays, not the echo
    share, goodput = targets(report)[:2]
    assert share == (
        "3x: >= 99% within the objective at 80% load (90.00%; the grpc.aio echo, no model, "
        "at the same schedules: 97.00%)", False,
    )  # fmt: skip
    assert "better fixed delay's 95/s" in goodput[0]  # the echo's 97/s is not a fixed delay
    text = render(load(dump(report)))
    (echo_row,) = [r for r in text.splitlines() if "| grpc.aio echo (reference) |" in r]
    assert "| 97.00% | 97 |" in echo_row
    rows = [r for r in text.splitlines() if r.startswith("| 80% |")]
    assert "(reference)" in rows[-1]  # after the three configs
    assert "- reference: the grpc.aio echo floor" in text
    without = _report({(0.8, c): 90 for c in CONFIGS})  # a run from before the reference
    assert "echo" not in render(without)
    assert "echo" not in targets(without)[0][0]


def test_the_batch_1_latency_says_how_it_was_measured_and_older_runs_keep_theirs() -> None:
    report = _report({(0.8, c): 100 for c in CONFIGS})
    assert "batch-1 latency 0.50 ms (p50 at one closed-loop client)" in render(report)
    report.batch1_batch, report.batch1_closed_ms = 1.02, 0.31
    again = load(dump(report))
    assert (again.batch1_batch, again.batch1_closed_ms) == (1.02, 0.31)
    text = render(again)
    assert "batch-1 latency 0.50 ms: the p50 of lone requests" in text
    assert "mean batch 1.02" in text
    assert "one closed-loop client's p50 0.31 ms" in text
    assert report.server_objective_us(1500) == 1500  # the server's own time not measured
    report.batch1_server_ms = 0.2
    again = load(dump(report))
    assert again.client_share_us() == 300  # 0.50 ms at the client, 0.20 in the server
    assert again.server_objective_us(1500) == 1200
    assert again.server_objective_us(250) == 1  # never 0, which would mean no objective
    text = render(again)
    assert "the client and the network add 0.30 ms" in text
    assert "## Objective 3x batch-1: 1.50 ms (the objective-driven config's server is given " \
        "1.20 ms)" in text  # fmt: skip
    older = json.loads(dump(again))
    del older["batch1_batch"], older["batch1_closed_ms"], older["batch1_server_ms"]
    assert "(p50 at one closed-loop client)" in render(load(json.dumps(older)))
    assert "## Objective 3x batch-1: 1.50 ms\n" in render(load(json.dumps(older)))


def test_statistics_give_the_successes_and_the_time_they_took_the_server() -> None:
    body = {"model_stats": [{
        "inference_count": 12, "execution_count": 5, "batchserve": {"batch_cap": 32},
        "inference_stats": {"success": {"count": 10, "ns": 2_500_000}},
    }]}  # fmt: skip
    assert counts_from_stats(body) == Counts(12, 5, 32, 10, 2_500_000)
    del body["model_stats"][0]["inference_stats"]  # a server that does not count them
    assert counts_from_stats(body) == Counts(12, 5, 32)


def test_a_run_that_stopped_counts_its_due_requests_as_none_within() -> None:
    due = [0.5 + k / 1000 for k in range(6000)]  # 1,000/s for 6 s, the first at 0.5 s
    stopped = unanswered(due, 1.0, 5.0)
    assert (stopped.requests, stopped.within, stopped.failed) == (4000, 0, 4000)
    assert (stopped.share, stopped.goodput, stopped.offered) == (0.0, 0.0, 1000.0)
    assert stopped.sent_rate == 0.0
    shipped = load_pbtxt(MODEL_REPO / "digits_cnn" / CONFIG_FILENAME)
    assert _config(override(shipped, SHIPPED, 1500)) == shipped  # the capacity's config


class _Ticking:
    """A clock that sleeping advances, and a server whose inference count grows until
    ``busy_until``."""

    def __init__(self, busy_until: float) -> None:
        self.now = 0.0
        self.busy_until = busy_until

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def inferences(self) -> int:
        return round(min(self.now, self.busy_until) * 1000)


def test_a_run_waits_until_the_server_has_cleared_what_the_one_before_left() -> None:
    busy = _Ticking(busy_until=3.0)
    waited = settle(busy.inferences, quiet_s=0.5, clock=busy.clock, sleep=busy.sleep)
    assert 3.5 <= waited < 3.7  # the backlog's 3 s, then half a second without an inference
    idle = _Ticking(busy_until=0.0)
    assert settle(idle.inferences, quiet_s=0.5, clock=idle.clock, sleep=idle.sleep) < 0.7


def test_settling_gives_up_at_its_limit() -> None:
    stuck = _Ticking(busy_until=1e9)
    waited = settle(
        stuck.inferences, quiet_s=0.5, limit_s=2.0, clock=stuck.clock, sleep=stuck.sleep
    )
    assert 2.0 <= waited < 2.2


class KeptUpBelow:
    """A server that keeps up with Poisson load up to ``limit`` per second and falls behind
    past it; the rates it was probed at are kept."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.probed: list[float] = []

    def __call__(self, rate: float) -> Figures:
        self.probed.append(rate)
        p99 = 30.0 if rate <= self.limit else 1500.0
        return Figures(round(rate), round(rate), 0, 1.0, 5.0, p99, 0.5)


def test_the_open_loop_capacity_is_the_last_share_kept_up_with() -> None:
    probe = KeptUpBelow(650.0)
    share, tried = open_share(probe, 1000.0)
    assert share == 0.6
    assert [step for step, _, _ in tried] == [0.3, 0.4, 0.5, 0.6, 0.7]  # stops at the first miss
    assert probe.probed == pytest.approx([300.0, 400.0, 500.0, 600.0, 700.0])
    assert tried[-1][1] == 1500.0


def test_open_loop_capacity_falls_back_to_the_first_step_and_tops_out_at_the_closed_one() -> None:
    assert open_share(KeptUpBelow(100.0), 1000.0)[0] == OPEN_STEPS[0]
    share, tried = open_share(KeptUpBelow(5000.0), 1000.0)
    assert share == 1.0
    assert len(tried) == len(OPEN_STEPS)


def test_keeping_up_needs_every_answer_a_bounded_p99_and_the_schedule_sent() -> None:
    assert kept_up(Figures(1000, 990, 0, 1.0, 2.0, 40.0, 0.5), 1000.0)
    assert not kept_up(Figures(1000, 990, 0, 1.0, 2.0, 400.0, 0.5), 1000.0)  # queue grew
    assert not kept_up(Figures(1000, 990, 3, 1.0, 2.0, 40.0, 0.5), 1000.0)  # unanswered
    assert not kept_up(Figures(800, 800, 0, 1.0, 2.0, 40.0, 0.5), 1000.0)  # offered 80 %
    behind = Figures(1000, 990, 0, 1.0, 2.0, 40.0, 0.5, sent=800)  # the rest sent too late
    assert not kept_up(behind, 1000.0)
    assert kept_up(replace(behind, sent=950), 1000.0)


def test_over_three_rounds_each_config_runs_in_each_place_of_every_cell_once() -> None:
    cells = 6  # two objectives x three loads
    for cell in range(cells):
        orders = [config_order(round_, cell) for round_ in range(len(CONFIGS))]
        for order in orders:
            assert sorted(order) == sorted(CONFIGS)
        for place in range(len(CONFIGS)):
            assert sorted(order[place] for order in orders) == sorted(CONFIGS)
    # and within one round the first place moves from cell to cell
    assert len({config_order(0, cell)[0] for cell in range(len(CONFIGS))}) == len(CONFIGS)


def _followers(orders: list[tuple[str, ...]]) -> collections.Counter[tuple[str, str]]:
    return collections.Counter(pair for order in orders for pair in itertools.pairwise(order))


def test_each_config_follows_each_other_config_equally_often() -> None:
    """What one run leaves to the next (a warm or a slow host, a backlog) must not fall on one
    config: a rotation in one direction always had the same config play before another."""
    n = len(CONFIGS)
    wanted = {(a, b) for a in CONFIGS for b in CONFIGS if a != b}
    two_cells = [config_order(r, c) for c in (0, 1) for r in range(n)]  # --rounds 3
    assert set(_followers(two_cells)) == wanted
    assert set(_followers(two_cells).values()) == {2}
    six_rounds = [config_order(r, 0) for r in range(2 * n)]  # --rounds 6: within one cell
    assert set(_followers(six_rounds).values()) == {2}
    assert len(_followers(six_rounds)) == len(wanted)
