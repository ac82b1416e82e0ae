"""How many request-handling workers the cores this process may use make
(``core/cpu_budget.py`` reads those cores).
"""

from __future__ import annotations

MAX_AUTO_WORKERS = 8


def auto_workers(cpus: int) -> int:
    """The ``auto`` number of request-handling workers for ``cpus`` cores.

    One core is left to the model-owning process, which batches requests and runs CPU
    models or feeds the GPU. On two cores two workers lost to one process at most points
    (0.42-1.24 of its throughput, ``bench/NOTES.md``, tenth round), so two cores or fewer
    get one. The count stops at 8: measured on two cores, the model-owning process spent
    17-45 µs a request over HTTP at c=64 and a worker 67-150 µs, so a handful of workers
    keep it busy and more would only wait on it (over gRPC both cost more: 130-180 and
    210-450 µs). On a 16-core host (digits_cnn, 32 clients a worker, ``bench/GPU_RESULTS.md``)
    eight workers served the most of 1, 2, 4 and 8: 2.6x one process over HTTP and 4.2x over
    gRPC, against 2.2x and 2.9x with four.
    """
    if cpus <= 2:
        return 1
    return min(cpus - 1, MAX_AUTO_WORKERS)


def resolve_workers(setting: str | int, cpus: int) -> int:
    """The worker count a ``--workers`` value asks for: ``auto`` (sized from ``cpus``) or a
    positive number, as an int or its text."""
    if setting == "auto":
        return auto_workers(cpus)
    workers = int(setting) if isinstance(setting, int) or setting.isdecimal() else 0
    if workers < 1:
        raise ValueError(f"workers must be 'auto' or a positive number, not {setting!r}")
    return workers
