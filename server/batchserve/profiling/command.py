"""`batchserve profile MODEL`: find the instance count, max_batch_size and queue delay that
give the most throughput within a p99 latency budget, and write them into config.pbtxt.

Exit status: 0 when a setting met the budget (and was written, unless --dry-run or it is
the config as it is), 1 when none did (nothing is written), 2 when the profile could not run.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from batchserve.core.errors import BatchserveError, InvalidArgument, NotFound
from batchserve.core.progress import StageProgress
from batchserve.profiling.plan import DEFAULT_CONCURRENCY
from batchserve.profiling.results import BUDGET_FACTOR

if TYPE_CHECKING:
    from batchserve.profiling.sweep import Request

PROG = "batchserve profile"
DESCRIPTION = f"""\
Start a batchserve server on the model repository (explicit model control, loopback, free
ports), measure the config as it is, then load the model once per setting with a config
override and drive each with NVIDIA's perf_analyzer at the same number of clients
(--concurrency, default {DEFAULT_CONCURRENCY}: set it to your traffic's concurrency). It prints
throughput and latency per setting. The recommendation is the highest throughput whose p99
is within --latency-budget (default {BUDGET_FACTOR:g} x the p99 of the config as it is at the
same load; ties within 2 %, or within what the config as it is moved by between its two
measurements where that is more, go to the config as it is, else to the lower p99). It is
written into the model's config.pbtxt, changing only instance_group count, max_batch_size and
dynamic_batching.max_queue_delay_microseconds, with the file as it was kept beside it as
config.pbtxt.orig (.orig.1, ... when that exists); when it is the config as it is, the file
is left alone (--output FILE is still written).

Sweeps: the full one is instances 1,2,4 x max_batch_size 1-128 (powers of 2) x queue delay
0, 1000, 10000 us, each also with the model's current value (so the current setting is one
of the rows); --quick is instances 1,2 x max_batch_size 1, 8 x queue delay 0, each with the
current value, in short windows (under two minutes on 2 cores for the example models).

A sequence model is swept over instances x max_batch_size (its sequence batcher has no
queue delay of the dynamic batcher's), perf_analyzer sending sequences of 20 requests; a
decoupled model is driven over gRPC streams, timed to each request's last response. A model
of a backend built into the server (generation, repeat, square) has nothing to sweep: the
config as it is is measured and kept (a generation model's step model is loaded with it).
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="sweep instances x max_batch_size x queue delay with perf_analyzer and write "
        "the best config.pbtxt within a p99 latency budget",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", metavar="MODEL", help="the model to profile")
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=Path("model_repo"),
        help="model repository directory (default model_repo)",
    )
    parser.add_argument(
        "--model-config-name",
        metavar="NAME",
        help="profile and write <model>/configs/NAME.pbtxt where it exists, else config.pbtxt "
        "(as `serve --model-config-name`)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a few settings in short windows (under two minutes on 2 cores)",
    )
    parser.add_argument(
        "--latency-budget",
        type=_positive_float,
        metavar="MS",
        help=f"p99 latency budget in milliseconds (default: {BUDGET_FACTOR:g} x the p99 of the "
        "config as it is, measured first at the highest --concurrency)",
    )
    _add_sweep_arguments(parser)
    _add_measurement_arguments(parser)
    written = parser.add_mutually_exclusive_group()
    written.add_argument(
        "--output",
        type=Path,
        metavar="FILE",
        help="write the recommended config here instead of the model's config.pbtxt",
    )
    written.add_argument(
        "--dry-run", action="store_true", help="print the recommended config.pbtxt, write nothing"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(handler=run)


def _add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    sweep = parser.add_argument_group("what is swept (each LIST replaces that axis exactly)")
    sweep.add_argument(
        "--instance-counts",
        type=_int_list,
        metavar="LIST",
        help="instance_group counts, e.g. 1,2,4",
    )
    sweep.add_argument(
        "--max-batch-sizes",
        type=_int_list,
        metavar="LIST",
        help="max_batch_size values, e.g. 8,32,64",
    )
    sweep.add_argument(
        "--queue-delays",
        type=_int_list,
        metavar="LIST",
        help="max_queue_delay_microseconds values, e.g. 0,1000",
    )
    sweep.add_argument(
        "--concurrency",
        type=_int_list,
        metavar="LIST",
        default=[DEFAULT_CONCURRENCY],
        help="perf_analyzer clients, the same for every setting, each value a row per setting "
        f"(default {DEFAULT_CONCURRENCY}; set it to your traffic's concurrency)",
    )


def _add_measurement_arguments(parser: argparse.ArgumentParser) -> None:
    measure = parser.add_argument_group("how it is measured")
    measure.add_argument(
        "--protocol",
        choices=("http", "grpc"),
        help="what perf_analyzer speaks (default http; grpc streams for a decoupled model)",
    )
    measure.add_argument(
        "--perf-analyzer",
        type=Path,
        metavar="PATH",
        help="perf_analyzer binary (default: the one beside this Python, else on PATH)",
    )
    measure.add_argument(
        "--measurement-interval",
        type=_positive_int,
        metavar="MS",
        help="perf_analyzer window in ms (default 500 with --quick, else 1000)",
    )
    measure.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:DIMS",
        help="one request's dims of an input with free dims (repeatable; default 32 for "
        "each free dim), as perf_analyzer's --shape",
    )
    measure.add_argument(
        "--input-data",
        metavar="FILE",
        help="perf_analyzer --input-data: the requests' values (default: generated from the "
        "model's config: small integers, true lengths for its sequence-length input, N(0, 1) "
        "floats)",
    )
    measure.add_argument(
        "--memory-budget",
        metavar="BUDGET",
        help="the server's --memory-budget (settings that do not fit it are refused)",
    )


def run(args: argparse.Namespace) -> int:
    """The handler: the sweep, its table, and the recommendation written or printed."""
    from batchserve.profiling.report import leave_as_it_is, print_report, write_recommendation
    from batchserve.profiling.sweep import sweep

    progress = StageProgress.for_stderr(PROG, quiet=args.quiet)
    started = time.monotonic()
    try:
        request, config_path, text = _request(args)
        report = sweep(request, progress.say)
        chosen = print_report(request, report, time.monotonic() - started)
        if chosen is None:
            return 1
        if chosen.setting == report.current and args.output is None:
            leave_as_it_is(config_path)
        else:
            destination = None if args.dry_run else args.output or config_path
            write_recommendation(chosen.setting, text, destination)
    except BatchserveError as exc:
        print(f"{PROG}: error: {exc.message}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    progress.finish(f"profiled {args.model}")
    return 0


def _request(args: argparse.Namespace) -> tuple[Request, Path, str]:
    """The sweep's request, the config file profiled and its text ("" if there is none)."""
    from batchserve.models.model_config import parse_pbtxt, read_pbtxt_text
    from batchserve.models.model_names import validate_model_name
    from batchserve.profiling import perf_analyzer
    from batchserve.profiling.plan import Axes
    from batchserve.profiling.sweep import Request

    model_dir = args.model_repository / validate_model_name(args.model)
    if not model_dir.is_dir():
        raise NotFound(f"no model '{args.model}' in '{args.model_repository}'")
    if min(args.concurrency) < 1:
        raise InvalidArgument("--concurrency: every value must be 1 or more")
    config_path = _config_file(model_dir, args.model_config_name)
    source = str(config_path)
    present = config_path.exists() or config_path.is_symlink()
    text = read_pbtxt_text(config_path, source=source) if present else ""
    window = perf_analyzer.QUICK_WINDOW if args.quick else perf_analyzer.FULL_WINDOW
    if args.measurement_interval is not None:
        window = replace(window, interval_ms=args.measurement_interval)
    request = Request(
        repository=args.model_repository,
        model=args.model,
        base_config=parse_pbtxt(text, source=source),
        quick=args.quick,
        axes=Axes(args.instance_counts, args.max_batch_sizes, args.queue_delays),
        concurrencies=sorted(set(args.concurrency)),
        latency_budget_ms=args.latency_budget,
        protocol=args.protocol,
        window=window,
        perf_analyzer=perf_analyzer.find(args.perf_analyzer),
        shapes=_shapes(args.shape),
        input_data=args.input_data,
        serve_args=_serve_args(args),
    )
    return request, config_path, text


def _config_file(model_dir: Path, config_name: str | None) -> Path:
    """The file `serve --model-config-name` would read, the name checked as `serve` does."""
    from batchserve.core.settings import plain_config_name
    from batchserve.models.model_directory import config_path

    try:
        plain = None if config_name is None else plain_config_name(config_name)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    return config_path(model_dir, plain)


def _serve_args(args: argparse.Namespace) -> tuple[str, ...]:
    extra: list[str] = []
    if args.memory_budget:
        extra += ["--memory-budget", args.memory_budget]
    if args.model_config_name:
        extra += ["--model-config-name", args.model_config_name]
    return tuple(extra)


def _shapes(given: list[str]) -> dict[str, tuple[int, ...]]:
    from batchserve.profiling.sample_inputs import parse_shape

    try:
        return dict(parse_shape(text) for text in given)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("the list is empty")
    return values


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0: {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0: {text}")
    return value
