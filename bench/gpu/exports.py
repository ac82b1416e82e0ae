"""Every model the check serves, exported with the real ``batchserve export`` command.

Each (network, runtime, precision) goes into a repository of its own, so that an FP16 and an
FP32 export of one network never share a config. Exports run a few at a time: they are not
measured, and TensorRT's engine builds take minutes each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.common import ROOT
from bench.gpu import engine, networks
from bench.gpu.records import ExportResult, Key
from bench.gpu.runtimes import RuntimeSpec
from bench.targets import last_line

EXPORT_TIMEOUT_S = 900


@dataclass(frozen=True)
class Job:
    key: Key
    spec: RuntimeSpec
    repository: Path
    argv: tuple[str, ...]

    @property
    def model_dir(self) -> Path:
        return self.repository / self.spec.served_name(self.key.model)


def job(key: Key, spec: RuntimeSpec, root: Path, max_batch: int, image_size: int) -> Job:
    repository = root / f"{key.runtime}-{key.precision}"
    half = spec.half_module(key.precision)
    argv = (
        sys.executable, "-m", "batchserve.cli", "export",
        *networks.export_args(key.model, half, max_batch, image_size),
        "--name", key.model, "--model-repository", str(repository),
        *spec.export_flags(key.precision),
    )  # fmt: skip
    return Job(key, spec, repository, argv)


def run_all(jobs: Sequence[Job], workers: int) -> list[ExportResult]:
    """Every job, ``workers`` at a time; results in the jobs' order, progress as they end."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(run_one, jobs))


def run_one(job: Job) -> ExportResult:
    started = time.monotonic()
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    try:
        done = subprocess.run(
            job.argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        seconds = time.monotonic() - started
        return _report(ExportResult(job.key, False, seconds, error=f"over {EXPORT_TIMEOUT_S} s"))
    seconds = time.monotonic() - started
    written = engine.model_file(job.model_dir, job.spec).exists()
    if done.returncode != 0 or not written:
        error = last_line(done.stderr or done.stdout)
        return _report(
            ExportResult(job.key, False, seconds, error=f"exit {done.returncode}: {error}")
        )
    summary = "; ".join(
        line.strip() for line in done.stdout.splitlines() if "max abs error" in line
    )
    return _report(ExportResult(job.key, True, seconds, str(job.model_dir), summary))


def _report(result: ExportResult) -> ExportResult:
    outcome = "ok" if result.ok else f"FAILED {result.error}"
    print(f"  export {result.key.label}: {outcome} ({result.seconds:.0f} s)", flush=True)
    return result
