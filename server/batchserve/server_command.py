"""`batchserve serve`: flags named as Triton names them, each also a BATCHSERVE_* variable."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from batchserve.settings import Settings

# (flag, settings field, type, help); the environment variable is BATCHSERVE_<FIELD>.
FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("--model-repository", "model_repository", Path, "model repository directory"),
    ("--host", "host", str, "address to listen on (default 127.0.0.1)"),
    ("--http-port", "http_port", int, "HTTP port (default 8000; 0 picks a free one)"),
    ("--grpc-port", "grpc_port", int, "gRPC port (default 8001)"),
    ("--metrics-port", "metrics_port", int, "Prometheus metrics port (default 8002)"),
    ("--model-control-mode", "model_control_mode", str, "none (default) or explicit"),
    ("--max-queue-size", "max_queue_size", int, "requests queued per model before 503"),
    (
        "--memory-budget",
        "memory_budget",
        str,
        "memory per device for models: a fraction (0.9, the default) or a size (8GiB); "
        "or per kind: cpu=8GiB,gpu=0.9",
    ),
    ("--shutdown-delay", "shutdown_delay_seconds", float, "seconds not-ready before draining"),
    ("--shutdown-timeout", "shutdown_timeout_seconds", float, "longest drain, in seconds"),
    ("--log-level", "log_level", str, "debug, info (default), warning, error"),
    ("--log-format", "log_format", str, "json (default) or text"),
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model repository over HTTP and gRPC",
        description="Serve a model repository (KServe v2 / Triton protocol).",
    )
    for flag, field, kind, text in FLAGS:
        parser.add_argument(flag, dest=field, type=kind, default=None, help=text)
    parser.add_argument(
        "--load-model", dest="load_model", action="append", default=None,
        help="with --model-control-mode explicit: a model to load at start (repeatable)",
    )  # fmt: skip
    parser.set_defaults(handler=run)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Flags given on the command line win over BATCHSERVE_* variables, which win over defaults."""
    given = {field: getattr(args, field) for _, field, _, _ in FLAGS}
    if args.load_model is not None:
        given["load_model"] = tuple(args.load_model)
    return Settings(**{k: v for k, v in given.items() if v is not None})


def run(args: argparse.Namespace) -> int:
    from batchserve.app import run as run_server
    from batchserve.logs import configure_logging

    settings = settings_from_args(args)
    configure_logging(settings.log_level, settings.log_format)
    run_server(settings)
    return 0
