"""The measuring: one server, the config as it is first, then every setting at the same load.

The requests' values are generated from the config the server completed, unless given
(``sample_inputs.py``: perf_analyzer's own random data is no valid token id, and an input
with free dims needs a shape). perf_analyzer finds a sequence model in that config and sends
sequences itself; a decoupled model is driven over gRPC streams (``--streaming``), where
perf_analyzer times each request to its last response (its banner says the first; its code
takes the last). A model of a backend built into the server has nothing to sweep (it runs in
the server's event loop, without instances or batching of its own): the config as it is is
measured and kept. The first point (the config as it is, at the sweep's highest concurrency)
sets the default latency budget and fails the whole profile early when perf_analyzer cannot
drive the model at all. Every setting then faces the same clients, so rows differ by the
setting alone. Each setting is unloaded before the next loads, so a setting has the whole
memory budget to itself; one the server refuses is kept as a refused row.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from batchserve.core.errors import InvalidArgument
from batchserve.models.decoupled import builtin_backend, step_model
from batchserve.models.ensemble_config import composing_models, is_ensemble
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
        protocol: what perf_analyzer speaks; None: gRPC for a decoupled model (it
            answers over streams only), else HTTP.
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
    protocol: str | None
    window: Window
    perf_analyzer: Path
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    input_data: str | None = None
    serve_args: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class Report:
    """What the sweep found: the current setting and its first measurement, every setting's
    rows, the budget used, the protocol spoken and what the requests held."""

    current: Setting
    as_it_is: Measurement
    budget_ms: float
    outcomes: list[Outcome]
    protocol: str
    requests: str = ""
    """What the requests held (their values and free dims, sequences, streams)."""
    fixed: str = ""
    """Why nothing was swept, for a model whose settings the server does not use."""


def sweep(request: Request, say: Callable[[str], None]) -> Report:
    """Start the server, measure, stop it; ``say`` hears of each point as it is done."""
    with (
        ProfiledServer.start(request.repository, request.serve_args) as server,
        tempfile.TemporaryDirectory(prefix="batchserve-profile-") as work,
    ):
        current, config = _load_as_it_is(server, request)
        fixed = _nothing_to_sweep(config, request.axes)
        perf_args, requests = _perf_args(request, config, Path(work))
        protocol, streaming = _protocol(request, config)
        if streaming:
            perf_args += ("--streaming",)
            requests += "; over gRPC streams, latency to each request's last response"
        target = Target(request.perf_analyzer, request.model, protocol, server.url(protocol),
                        perf_args)  # fmt: skip
        as_it_is = _measure_as_it_is(target, request)
        say(f"the config as it is, at {as_it_is.concurrency} clients: {_summary(as_it_is)}")
        budget = request.latency_budget_ms or default_budget(as_it_is)
        if fixed:
            only = [Outcome(current, as_it_is.concurrency, as_it_is)]
            return Report(current, as_it_is, budget, only, protocol, requests, fixed)
        settings = plan(current, quick=request.quick, given=request.axes)
        outcomes: list[Outcome] = []
        for index, setting in enumerate(settings, 1):
            done = _setting(server, target, request, setting)
            outcomes += done
            for outcome in done:
                say(f"[{index}/{len(settings)}] {setting.label}: {_outcome_summary(outcome)}")
    return Report(current, as_it_is, budget, outcomes, protocol, requests)


def _load_as_it_is(server: ProfiledServer, request: Request) -> tuple[Setting, ModelConfig]:
    """Load the model from its own config, after the step model it runs on, if any; what
    the server completed is the current setting."""
    called = step_model(request.base_config)
    try:
        if called is not None:
            server.load(called)
        server.load(request.model)
    except ServerRefused as exc:
        raise ProfileError(f"the model does not load as it is: {exc.message}") from None
    config = server.config(request.model)
    return current_setting(config), config


def _nothing_to_sweep(config: ModelConfig, axes: Axes) -> str:
    """Why the model has no setting to sweep (an ensemble's, a built-in backend's), else ""."""
    backend = builtin_backend(config)
    if is_ensemble(config):
        composing = ", ".join(f"'{name}'" for name in composing_models(config))
        why = (
            "nothing to sweep: an ensemble has no instances or batching of its own; its "
            f"steps batch in its composing models: profile {composing}"
        )
    elif backend is not None:
        why = (
            f"nothing to sweep: backend '{backend}' runs in the server's event loop, without "
            "instances or batching of its own"
        )
        called = step_model(config)
        if called is not None:
            why += f"; its throughput is that of its step model: profile '{called}'"
    else:
        return ""
    if axes != Axes():
        raise InvalidArgument(f"{why} (so --instance-counts and the other axes do not apply)")
    return why


def _protocol(request: Request, config: ModelConfig) -> tuple[str, bool]:
    """What perf_analyzer speaks, and whether over streams: a decoupled model answers
    over gRPC streams only."""
    if not config.model_transaction_policy.decoupled:
        return request.protocol or "http", False
    if request.protocol == "http":
        raise InvalidArgument(
            f"'{request.model}' is decoupled: it answers over gRPC streams only, which "
            "perf_analyzer drives with --streaming (leave --protocol out, or set grpc)"
        )
    return "grpc", True


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
    if inputs.steps > 1:
        generated += f"; sequences of {inputs.steps} requests"
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
