"""torch's CPU thread pools: set once per process, from the first program's config or from the
CPUs this process may use.

torch has one intra-op pool size (and one inter-op pool) per process, not per model, so
Triton's PyTorch backend reads ``INTRA_OP_THREAD_COUNT`` and ``INTER_OP_THREAD_COUNT`` from a
model's parameters and applies the first positive value it meets, once. This backend reads
the same names, and fixes both counts when the first program loads: what that config names,
or else one thread per physical core this process may use, bounded by its cgroup's CPU quota
(``core/cpu_budget.runtime_threads``). Left to itself torch follows the affinity but not the
quota: in a pod with a CPU limit of 2 on a node of 64 cores it would run 64 threads in the
time of 2. The counts are fixed at the first load, not at the first config that names one,
because each thread torch computes on takes the count when it first runs an operator
(OpenMP's setting is per thread; a thread that had run one kept 2 threads after
``torch.set_num_threads(1)``): a later change would reach only some threads. A later config
naming other counts is told, in the log, which hold and why.
``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``, which torch itself reads, stand where set.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchserve.backends.thread_counts import named_thread_count
from batchserve.core.cpu_budget import runtime_threads
from batchserve.proto.model_config_pb2 import ModelConfig

_log = logging.getLogger(__name__)

INTRA_OP = "INTRA_OP_THREAD_COUNT"
INTER_OP = "INTER_OP_THREAD_COUNT"
PARAMETERS = (INTRA_OP, INTER_OP)
"""Triton's PyTorch backend's names for the two pools' sizes."""
ENVIRONMENT = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Variables torch reads for its intra-op pool: a deployment that sets one has chosen."""


@dataclass(frozen=True, slots=True)
class ThreadCounts:
    """The counts this process's torch runs with, and who chose them."""

    intra_op: int
    inter_op: int
    chosen_by: str


_LOCK = threading.Lock()
_fixed: ThreadCounts | None = None


def named_counts(config: ModelConfig, model_file: Path) -> tuple[int, int]:
    """The intra-op and inter-op counts ``config`` names (0 where it names none: see
    ``thread_counts``)."""
    params = {key: value.string_value for key, value in config.parameters.items()}
    intra, inter = (named_thread_count(params, key, model_file) for key in PARAMETERS)
    return intra, inter


def fix_thread_counts(
    torch: Any,
    config: ModelConfig,
    model_file: Path,
    cpu_threads: Callable[[], int] | None = None,
) -> ThreadCounts:
    """Set torch's pools on the first call in this process; on later ones say, when
    ``config`` names other counts, that the first ones hold. ``cpu_threads``: the count for
    a pool no config names (``runtime_threads`` unless given)."""
    global _fixed
    intra, inter = named_counts(config, model_file)
    model = config.name or model_file.parent.parent.name
    with _LOCK:
        if _fixed is None:
            _fixed = _apply(torch, intra, inter, model, cpu_threads)
        fixed = _fixed
    ignored = [
        f"{key} {named} (torch runs {held})"
        for key, named, held in (
            (INTRA_OP, intra, fixed.intra_op),
            (INTER_OP, inter, fixed.inter_op),
        )
        if named and named != held
    ]
    if ignored:
        _log.warning(
            "model '%s': %s ignored: torch's thread pools are one per process, and were set "
            "when %s loaded; set the same counts in every PyTorch model's config",
            model, ", ".join(ignored), fixed.chosen_by,
        )  # fmt: skip
    return fixed


def _apply(
    torch: Any, intra: int, inter: int, model: str, cpu_threads: Callable[[], int] | None
) -> ThreadCounts:
    """Size both pools: as named, else by the CPUs this process may use (the intra-op pool
    keeps torch's own count where the environment sets one)."""
    by_environment = any(os.environ.get(name) for name in ENVIRONMENT)
    default = (cpu_threads or runtime_threads)()
    if intra or not by_environment:
        torch.set_num_threads(intra or default)
    try:
        torch.set_num_interop_threads(inter or default)
    except RuntimeError:  # the pool already ran (torch allows one setting, before it starts)
        _log.warning("torch's inter-op pool already started; it keeps its size")
    if intra or inter:
        source = "its config's parameters"
    elif by_environment:
        source = "the environment's thread variables, and the CPUs this process may use"
    else:
        source = "the CPUs this process may use"
    counts = ThreadCounts(
        int(torch.get_num_threads()), int(torch.get_num_interop_threads()),
        f"model '{model}'" if intra or inter else "the first PyTorch model",
    )  # fmt: skip
    _log.info(
        "torch computes on %d intra-op and %d inter-op thread(s) in this process (%s: %s)",
        counts.intra_op, counts.inter_op, counts.chosen_by, source,
    )  # fmt: skip
    return counts
