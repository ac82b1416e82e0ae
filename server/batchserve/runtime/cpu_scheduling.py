"""The server's threads under Linux's ``SCHED_BATCH`` policy, so that on busy cores they stop
preempting one another each time one of them wakes.

A serving process is a handful of threads handing work to each other: the event loop,
grpc's poller and event-engine threads, the threads that run batches, ONNX Runtime's
pool; with workers, one such set per process. Under the normal policy a thread that wakes
on a busy core usually preempts the one running there. On the 2-core reference machine at
gRPC concurrency 64 with two workers, each worker's event loop was switched out against its
will about 7,000 times a second, while its grpc poller thread woke 8,000 times a second.
``SCHED_BATCH`` keeps the same share of the cores (nice values still apply) but a thread
that wakes waits for the running one to block or its slice to end; where a core is idle it
runs at once, so a lightly loaded server is untouched.

Measured there (``bench/NOTES.md``, twenty-first round), fresh servers taking turns: gRPC
at concurrency 64, 1.14x the throughput in the median round with two workers and 1.16x in
one process, the server's CPU per request 114-169 µs against 128-232 (lower in 7 of 8
rounds); with the load generator under the same policy the gain held, so it is the
server's own. HTTP and gRPC at concurrency 16 with two workers were within the machine's
noise; concurrency 1 unchanged.

A process may move its own threads between the normal and batch policies without
privileges; where it cannot (another OS, a seccomp profile that forbids the call) the
server logs why and runs on under the policy it has. Threads started later inherit the
policy of the thread that starts them, and so do the worker processes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from batchserve.core.settings import CpuScheduling

logger = logging.getLogger(__name__)


def apply(policy: CpuScheduling) -> None:
    """Put every thread of this process under ``policy``; ``normal`` leaves them as they are
    (the policy the process was started with, ``chrt`` included)."""
    if policy == "normal":
        return
    setter = getattr(os, "sched_setscheduler", None)
    batch = getattr(os, "SCHED_BATCH", None)
    if setter is None or batch is None:
        logger.warning("SCHED_BATCH is not available here: threads keep their policy")
        return
    threads = _threads()
    moved = 0
    for thread in threads:
        try:
            setter(thread, batch, os.sched_param(0))
            moved += 1
        except ProcessLookupError:
            continue  # it ended meanwhile
        except OSError as exc:
            logger.warning(
                "could not put the server's threads under SCHED_BATCH: they keep their policy",
                extra={"error": str(exc)},
            )
            return
    logger.debug("threads under SCHED_BATCH", extra={"threads": moved})


def _threads() -> list[int]:
    """This process's thread ids; the calling thread alone where /proc is not mounted."""
    try:
        return [int(entry.name) for entry in Path("/proc/self/task").iterdir()]
    except OSError:
        return [0]
