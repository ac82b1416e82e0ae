"""The measuring: one server, the config as it is first, then every setting at the same load.

The requests' values are generated from the config the server completed, unless given
(``sample_inputs.py``: perf_analyzer's own random data is no valid token id, and an input
with free dims needs a shape). The first point (the config as it is, at the sweep's highest
concurrency) sets the default latency budget and fails the whole profile early when
perf_analyzer cannot drive the model at all. Every setting then faces the same clients, so rows
differ by the setting alone. Each setting is unloaded before the next loads, so a setting has
the whole memory budget to itself; one the server refuses is kept as a refused row.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from batchserve.core.errors import InvalidArgument, Unsupported
from batchserve.profiling.config_edit import apply, current_setting
from batchserve.profiling.errors import ProfileError, ServerRefused
from batchserve.profiling.perf_analyzer import Measurement, Target, Window, measure
from batchserve.profiling.plan import Axes, Setting, plan
from batchserve.profiling.results import Outcome, default_budget
from batchserve.profiling.sample_inputs import UnsupportedInput, shape_flag
from batchserve.profiling.sample_inputs import plan as plan_inputs
from batchserve.profiling.server import ProfiledServer
from batchserve.proto.model_config_pb2 import ModelConfig


@dataclass(frozen=True, slots=True)
class Request:
    """Everything a sweep needs, resolved from the command line.

    Args:
        base_config: the model's config.pbtxt as written (empty when it has none); each
            setting is loaded as this with the three swept fields changed.
        concurrencies: perf_analyzer's client counts, each a row of every setting.
        shapes: one request's dims of inputs with free dims, by input name.
        input_data: perf_analyzer's ``--input-data``; None: generated from the config.
        serve_args: further `serve` flags.
    """

    repository: Path
    model: str
    base_config: ModelConfig
    quick: bool
    axes: Axes
    concurrencies: Sequence[int]
    latency_budget_ms: float | None
    protocol: str
    window: Window
    perf_analyzer: Path
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    input_data: str | None = None
    serve_args: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class Report:
    """What the sweep found: the current setting and its first measurement, every setting's
    rows, the budget used, and what the requests held."""

    current: Setting
    as_it_is: Measurement
    budget_ms: float
    outcomes: list[Outcome]
    requests: str = ""
    """What the requests held (their values and free dims), for the report."""


def sweep(request: Request, say: Callable[[str], None]) -> Report:
    """Start the server, measure, stop it; ``say`` hears of each point as it is done."""
    with (
        ProfiledServer.start(request.repository, request.serve_args) as server,
        tempfile.TemporaryDirectory(prefix="batchserve-profile-") as work,
    ):
        current, config = _load_as_it_is(server, request.model)
        perf_args, requests = _perf_args(request, config, Path(work))
        target = Target(request.perf_analyzer, request.model, request.protocol,
                        server.url(request.protocol), perf_args)  # fmt: skip
        as_it_is = _measure_as_it_is(target, request)
        say(f"the config as it is, at {as_it_is.concurrency} clients: {_summary(as_it_is)}")
        budget = request.latency_budget_ms or default_budget(as_it_is)
        settings = plan(current, quick=request.quick, given=request.axes)
        outcomes: list[Outcome] = []
        for index, setting in enumerate(settings, 1):
            done = _setting(server, target, request, setting)
            outcomes += done
            for outcome in done:
                say(f"[{index}/{len(settings)}] {setting.label}: {_outcome_summary(outcome)}")
    return Report(current, as_it_is, budget, outcomes, requests)


def _load_as_it_is(server: ProfiledServer, model: str) -> tuple[Setting, ModelConfig]:
    """Load the model from its own config; what the server completed is the current setting."""
    try:
        server.load(model)
    except ServerRefused as exc:
        raise ProfileError(f"the model does not load as it is: {exc.message}") from None
    config = server.config(model)
    if config.HasField("sequence_batching") or config.model_transaction_policy.decoupled:
        raise Unsupported(
            f"'{model}' is a sequence or decoupled model: profile sweeps dynamic batching, "
            "which these models do not use"
        )
    return current_setting(config), config


def _perf_args(request: Request, config: ModelConfig, work: Path) -> tuple[tuple[str, ...], str]:
    """perf_analyzer's ``--shape`` and ``--input-data`` flags, and what the requests hold:
    the data given, or values generated from ``config`` (perf_analyzer's own, with the
    shapes, where they cannot be: strings)."""
    unknown = sorted(set(request.shapes) - {tensor.name for tensor in config.input})
    if unknown:  # (a benchmark's shapes may name other models' inputs; one model's may not)
        raise InvalidArgument(f"--shape {unknown[0]}: {request.model} has no input of that name")
    given = tuple(
        arg for name, dims in request.shapes.items() for arg in ("--shape", shape_flag(name, dims))
    )
    if request.input_data is not None:
        return (*given, "--input-data", request.input_data), f"the values of {request.input_data}"
    try:
        inputs = plan_inputs(request.model, config, request.shapes)
    except UnsupportedInput as exc:
        return given, f"perf_analyzer's own random values ({exc})"
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    generated = "values generated from the config (--input-data FILE sets them)"
    notes = "".join(f"; {note.removeprefix(f'{request.model}: ')}" for note in inputs.notes)
    return tuple(inputs.pa_args(work)), generated + notes


def _measure_as_it_is(target: Target, request: Request) -> Measurement:
    """The config as it is at the highest concurrency swept: the default budget's base."""
    clients = max(request.concurrencies)
    try:
        return measure(target, clients, request.window)
    except ProfileError as exc:
        raise ProfileError(
            f"perf_analyzer could not drive '{request.model}' as it is, at {clients} clients: "
            f"{exc.message}"
        ) from None


def _setting(
    server: ProfiledServer, target: Target, request: Request, setting: Setting
) -> list[Outcome]:
    server.unload(request.model)
    try:
        server.load(request.model, apply(request.base_config, setting))
    except ServerRefused as exc:
        return [Outcome(setting, concurrency=0, problem=f"refused: {exc.message}")]
    return [_point(server, target, request, setting, c) for c in request.concurrencies]


def _point(
    server: ProfiledServer, target: Target, request: Request, setting: Setting, clients: int
) -> Outcome:
    before = server.batch_figures(request.model)
    try:
        measured = measure(target, clients, request.window)
    except ProfileError as exc:
        return Outcome(setting, clients, problem=exc.message)
    after = server.batch_figures(request.model)
    capped = after.batch_cap if after.batch_cap < setting.max_batch_size else None
    return Outcome(setting, clients, measured, after.average_batch_since(before), capped)


def _summary(measured: Measurement) -> str:
    return (
        f"{measured.throughput:.1f} infer/sec, p50 {measured.p50_ms:.2f} ms, "
        f"p99 {measured.p99_ms:.2f} ms"
    )


def _outcome_summary(outcome: Outcome) -> str:
    measured = outcome.measurement
    if measured is None:
        return outcome.problem
    return f"concurrency {outcome.concurrency}, {_summary(measured)}"
