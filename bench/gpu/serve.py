"""One served case: a fresh ``batchserve serve`` with the model, then every point on it.

Around the server, NVML's device-wide used memory is read before it starts, once the model
is ready (loaded, probed and warmed up at its batch cap) and sampled while it serves; the
memory probe's own figures (fixed and per-sample bytes, reservation and batch cap of each
instance) come from the model's statistics, for the report to set side by side.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import servers
from bench.common import model_stats
from bench.gpu import variants
from bench.gpu.load import LoadTool
from bench.gpu.nvml import UsedMemory
from bench.gpu.plan import Case
from bench.gpu.records import InstanceProbe, MemoryReading, Served
from bench.gpu.runtimes import RuntimeSpec
from bench.inputs import ModelInputs
from bench.records import ServerPoint
from bench.report import progress_line


@dataclass(frozen=True)
class Setup:
    """What every case of a run shares."""

    tool: LoadTool
    window_s: float
    work: Path


def probes(stats: dict[str, Any]) -> tuple[InstanceProbe, ...]:
    """The memory probe's figures of each instance, from a model's v2 statistics."""
    own = stats.get("batchserve", {})
    return tuple(
        InstanceProbe(
            str(i["device"]),
            int(i["fixed_bytes"]),
            int(i["per_sample_bytes"]),
            int(i["reserved_bytes"]),
            int(i["batch_cap"]),
        )
        for i in own.get("instances", [])
    )


def run_case(
    case: Case, model_dir: Path, spec: RuntimeSpec, inputs: ModelInputs, setup: Setup
) -> tuple[list[Served], MemoryReading | None, str]:
    """Every point of ``case``; a server that fails to start fails them all with its error."""
    repository = variants.build(model_dir, setup.work / "variants", case.variant, spec.device)
    name = spec.served_name(case.key.model)
    served: list[Served] = []
    with UsedMemory() as memory:
        before = memory.read()
        try:
            with servers.batchserve(repository, name) as running:
                loaded, found = memory.read(), probes(model_stats(running.ports["http"], name))
                memory.peak = loaded
                _points(case, running, name, inputs, setup, served)
        except RuntimeError as exc:
            return served, None, str(exc)
        reading = MemoryReading(case.key, case.variant, found, before, loaded, memory.peak)
    return served, reading, ""


def _points(
    case: Case,
    running: servers.Running,
    name: str,
    inputs: ModelInputs,
    setup: Setup,
    found: list[Served],
) -> None:
    """Each protocol x concurrency point, appended to ``found`` as it is taken."""
    settings = setup.tool.settings(setup.window_s)
    extra, driver = setup.tool.extra(inputs, setup.work), setup.tool.driver()
    batching = "on" if case.variant.batching else "off"
    for protocol in case.protocols:
        for c in case.concurrency:
            point: ServerPoint = servers.measure(
                running, name, protocol, c, batching, settings, setup.work, extra, driver
            )
            print(f"  {case.variant.label}:{progress_line(point)}", flush=True)
            found.append(Served(case.key, case.variant, point))
