"""What one GPU check found: plain values, shared by the collectors, the targets and the report.

A served point is the CPU benchmark's ``ServerPoint`` (perf_analyzer's figures or the load
generator's, with the server's own counts and CPU time around it), keyed here by the
runtime, precision and serving variant it was taken on.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from bench.records import ServerPoint

RESNET = "resnet50ish"
DIGITS = "digits_cnn"
MODELS = (DIGITS, RESNET)
"""The check's two networks (built by ``bench.gpu.models``)."""


@dataclass(frozen=True)
class Key:
    """One exported model: which network, on which runtime, at which precision."""

    model: str
    runtime: str
    precision: str

    @property
    def label(self) -> str:
        return f"{self.model} {self.runtime} {self.precision}"


@dataclass(frozen=True)
class Variant:
    """How a served model is configured: dynamic batching and CUDA graphs on or off."""

    batching: bool = True
    graphs: bool = False

    @property
    def label(self) -> str:
        return f"batching {_on(self.batching)}, graphs {_on(self.graphs)}"


def _on(flag: bool) -> str:
    return "on" if flag else "off"


@dataclass(frozen=True)
class RuntimeStatus:
    """A runtime as discovery found it: usable here, or why not."""

    key: str
    label: str
    present: bool
    version: str = ""
    reason: str = ""


@dataclass(frozen=True)
class ExportResult:
    """One ``batchserve export`` run: the model's directory, or why it failed."""

    key: Key
    ok: bool
    seconds: float = 0.0
    model_dir: str = ""
    summary: str = ""  # the exporter's own verification line(s)
    error: str = ""


@dataclass(frozen=True)
class Accuracy:
    """One output of a runtime against the FP32 eager module, on the same fixed batch.

    Args:
        max_abs: largest absolute difference.
        max_rel: largest difference relative to the reference element, over the elements
            at least 1 % of the output's largest magnitude (near-zero ones say nothing).
        top1: share of rows whose arg-max agrees (classification outputs), else None.
    """

    key: Key
    output: str
    batch: int
    max_abs: float
    max_rel: float
    top1: float | None


@dataclass(frozen=True)
class EnginePoint:
    """The runtime called in-process through batchserve's backend at one batch size."""

    key: Key
    batch: int
    median_s: float
    calls: int

    @property
    def samples_per_s(self) -> float:
        return self.batch / self.median_s


@dataclass(frozen=True)
class Served:
    """One load point against a served model."""

    key: Key
    variant: Variant
    point: ServerPoint


@dataclass(frozen=True)
class CoresPoint:
    """One point of request handling across the machine's cores (``cores.py``).

    Args:
        owner_us: CPU per request in the model-owning process (the whole server at N = 1).
        workers_us: CPU per request in all the workers together (0 at N = 1).
    """

    workers: int
    protocol: str
    concurrency: int
    throughput: float
    owner_us: float
    workers_us: float
    stable: bool = True
    """False where perf_analyzer did not reach its stability criterion (shown as such)."""
    machine_busy: float = 0.0
    """Share of every core's time busy over the point (0..1), the load generator's included."""
    load_us: float = 0.0
    """CPU per request in the load generator."""
    per_frame: float = 0.0
    """Requests per frame from the workers to the model-owning process (0 at N = 1)."""
    server_busy: float | None = None
    """Share of the server's own CPUs' time busy over the point, where the server and the
    load generator had CPUs of their own (else None)."""
    load_busy: float | None = None
    """The same share of the load generator's CPUs."""
    loop_busy: float | None = None
    """The model-owning process's event-loop thread's CPU over the point's wall time, in
    cores (None in one process, or in a record from before it was read)."""
    busiest_worker: float | None = None
    """The busiest worker's CPU over the point's wall time, in cores."""
    p50_ms: float | None = None
    """The load generator's median latency."""
    mean_batch: float | None = None
    """Inferences over executions the server counted over the point."""


@dataclass(frozen=True)
class InstanceProbe:
    """What batchserve's memory probe measured for one instance, and the cap it chose."""

    device: str
    fixed_bytes: int
    per_sample_bytes: int
    reserved_bytes: int
    batch_cap: int


@dataclass(frozen=True)
class MemoryReading:
    """The probe's figures beside NVML's device-wide used memory around one served model.

    Args:
        nvml_before: used bytes just before the server started (None: no NVML).
        nvml_loaded: used bytes once the model was loaded, probed and warmed up.
        nvml_peak: the most used bytes sampled while it served its points.
    """

    key: Key
    variant: Variant
    instances: tuple[InstanceProbe, ...]
    nvml_before: int | None = None
    nvml_loaded: int | None = None
    nvml_peak: int | None = None

    @property
    def reserved_bytes(self) -> int:
        return sum(i.reserved_bytes for i in self.instances)


@dataclass(frozen=True)
class PytestRun:
    """One pytest run over the GPU-marked tests of one directory."""

    group: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    seconds: float = 0.0
    failures: tuple[tuple[str, str], ...] = ()  # (test id, first line of the message)
    skips: tuple[tuple[str, int], ...] = ()  # (reason, how many tests)
    note: str = ""


@dataclass(frozen=True)
class Phase:
    """A part of the run: the seconds the plan gave it and those it took."""

    name: str
    planned_s: float
    taken_s: float = 0.0


@dataclass
class GpuResults:
    """Everything one check found, in the order the report shows it."""

    mode: str = "gpu"  # "gpu", or "cpu" for the dry run
    header: list[str] = field(default_factory=list)
    command: str = ""
    runtimes: list[RuntimeStatus] = field(default_factory=list)
    load_tool: str = ""
    tests: list[PytestRun] = field(default_factory=list)
    exports: list[ExportResult] = field(default_factory=list)
    accuracy: list[Accuracy] = field(default_factory=list)
    engine: list[EnginePoint] = field(default_factory=list)
    served: list[Served] = field(default_factory=list)
    memory: list[MemoryReading] = field(default_factory=list)
    cores: list[CoresPoint] = field(default_factory=list)
    cores_note: str = ""
    """Why request handling across cores was not measured, or stopped early."""
    cores_model: str = ""
    """The model request handling across cores was measured on, and where it ran."""
    cores_cpus: str = ""
    """Which CPUs the server and the load generator ran on ("": both on any)."""
    phases: list[Phase] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    finished: bool = False
    """False while the run is under way: the report written after each phase says so."""

    def engine_points(self, key: Key) -> list[EnginePoint]:
        return sorted((p for p in self.engine if p.key == key), key=lambda p: p.batch)

    def served_points(self, key: Key, variant: Variant, protocol: str) -> list[Served]:
        return [
            s
            for s in self.served
            if (s.key, s.variant, s.point.protocol) == (key, variant, protocol)
        ]

    def present(self) -> list[str]:
        return [r.key for r in self.runtimes if r.present]


def dump(results: GpuResults) -> str:
    """Every figure of a check as JSON, beside its report."""
    return json.dumps(asdict(results), indent=1, allow_nan=True)
