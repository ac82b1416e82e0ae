"""The `batchserve` console script: one subcommand per job, each defined beside its code.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``handler`` to a function taking the parsed namespace and returning an exit code.
Command modules keep their heavy imports (torch, TensorRT) inside the handler.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from batchserve.runtime import memmove_tuning

COMMAND_MODULES = (
    "batchserve.export.command",
    "batchserve.profiling.command",
    "batchserve.runtime.repository_command",
    "batchserve.runtime.serve_command",
)

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchserve",
        description="Inference server for ONNX and TensorRT models (KServe v2 / Triton protocol).",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Before any command module imports grpc: this program starts its processes by fork
    # and exec, never forks to run on, so grpc's fork handlers have nothing to protect;
    # with them on, grpc core writes "skipping fork() handlers" to stderr, outside the
    # structured logs, at every worker start.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    if argv is None and sys.argv[1:2] == ["serve"]:  # this process is the server: tune it
        memmove_tuning.restart_tuned()  # before any thread or socket (``memmove_tuning.py``)
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
