"""Length-bucketed batching against padding every batch to its longest request.

    python -m bench.length_buckets [--rounds 3] [--window-ms 5000] [--concurrency 32]
                                   [--instances N --threads T] [--out bench/LENGTH_BUCKETS.md]

One server holds char_lstm twice: as shipped (length buckets on) and with
``length_buckets { disabled: true }``. perf_analyzer sends both the same requests, whose
lengths are uniform in 8..256, in alternating rounds; the share of padded input elements
comes from the server's own counters (``batchserve_batch_padding_elements`` over
``batchserve_batch_input_elements``) over each round. char_lstm's config leaves instances
and threads to the load's measurement, which may choose differently for the two: the report
says what each got, and ``--instances``/``--threads`` set both alike.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from batchserve.zoo.char_lstm import PAD, VOCAB_SIZE

from bench import machine
from bench.common import ROOT, start_server, stop_server
from bench.perf import PaSettings, run

MODEL = "char_lstm"
PADDED = "char_lstm_padded"
SHORTEST, LONGEST = 8, 256
SAMPLES = 512
ANY_STABILITY = 1000
"""perf_analyzer's stability (%) for a last try at a point: any window is taken."""


@dataclass(frozen=True)
class Round:
    model: str
    throughput: float
    padding_share: float
    """Padded input elements over all input elements the model received in the round."""
    stable: bool


def input_data(path: Path, seed: int = 0) -> Path:
    """perf_analyzer's input file: requests of lengths uniform in SHORTEST..LONGEST."""
    rng = np.random.default_rng(seed)
    data = []
    for length in rng.integers(SHORTEST, LONGEST + 1, SAMPLES):
        tokens = rng.integers(0, VOCAB_SIZE, int(length))
        tokens[tokens == PAD] = PAD + 1
        data.append({
            "tokens": {"content": tokens.tolist(), "shape": [int(length)]},
            "lengths": {"content": [int(length)], "shape": [1]},
        })  # fmt: skip
    path.write_text(json.dumps({"data": data}))
    return path


def padded_twin(repo: Path, instances: int = 0, threads: int = 0) -> None:
    """char_lstm as shipped, and a copy that pads every batch to its longest request; with
    ``instances``, both get that many CPU instances of ``threads`` threads each."""
    shutil.copytree(ROOT / "model_repo" / MODEL, repo / MODEL)
    shutil.copytree(ROOT / "model_repo" / MODEL, repo / PADDED)
    config = repo / PADDED / "config.pbtxt"
    text = config.read_text().replace(f'name: "{MODEL}"', f'name: "{PADDED}"')
    if "batchserve {" not in text:
        raise SystemExit(f"{MODEL}'s config has no batchserve block to extend")
    text = text.replace("batchserve {", "batchserve {\n  length_buckets { disabled: true }", 1)
    config.write_text(text)
    if instances:
        for model in (MODEL, PADDED):
            path = repo / model / "config.pbtxt"
            path.write_text(path.read_text() + pinned(instances, threads))


def pinned(instances: int, threads: int) -> str:
    """Config text for ``instances`` CPU instances of ``threads`` threads (0: the runtime's)."""
    text = f"instance_group [{{ count: {instances} kind: KIND_CPU }}]\n"
    if threads:
        text += (f'parameters {{ key: "intra_op_thread_count" '
                 f'value: {{ string_value: "{threads}" }} }}\n')  # fmt: skip
    return text


def instance_setting(http_port: int, model: str) -> str:
    """What the server runs ``model`` on, from its config: "2 x 1 thread(s)"."""
    url = f"http://127.0.0.1:{http_port}/v2/models/{model}/config"
    with urllib.request.urlopen(url, timeout=10) as response:
        config = json.load(response)
    count = sum(int(group.get("count", 1)) for group in config.get("instance_group", []))
    threads = config.get("parameters", {}).get("intra_op_thread_count", {}).get("string_value")
    return f"{count or 1} x {threads + ' thread(s)' if threads else 'runtime threads'}"


def padding_counters(metrics_port: int, model: str) -> tuple[float, float]:
    """(padded, all) input elements the model has received so far."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found = {}
    for name in ("batchserve_batch_padding_elements", "batchserve_batch_input_elements"):
        match = re.search(rf'^{name}_total{{model="{model}",version="1"}} (\S+)$', text, re.M)
        if match is None:
            raise SystemExit(f"{name} for {model} is not on the metrics port")
        found[name] = float(match.group(1))
    return found["batchserve_batch_padding_elements"], found["batchserve_batch_input_elements"]


def measure(
    rounds: int, concurrency: int, settings: PaSettings, work: Path, pin: tuple[int, int]
) -> tuple[list[Round], dict[str, str]]:
    """Alternating rounds of both models, and the instance setting each was served with."""
    repo = work / "repo"
    repo.mkdir()
    padded_twin(repo, *pin)
    data = input_data(work / "lengths.json")
    process, ports = start_server(repo, ("--log-format", "json"))
    url = f"127.0.0.1:{ports['http_port']}"
    results = []
    try:
        served = {model: instance_setting(ports["http_port"], model) for model in (MODEL, PADDED)}
        print(served, flush=True)
        for index in range(rounds):
            order = (MODEL, PADDED) if index % 2 == 0 else (PADDED, MODEL)
            for model in order:
                results.append(_round(model, url, ports["metrics_port"], concurrency, settings,
                                      work, data))  # fmt: skip
                print(results[-1], flush=True)
    finally:
        stop_server(process)
    return results, served


def _round(
    model: str,
    url: str,
    metrics_port: int,
    concurrency: int,
    settings: PaSettings,
    work: Path,
    data: Path,
) -> Round:
    """One model's round; a point that settles neither at the bench's stability nor at
    perf_analyzer's loose retry is taken once more at any stability (``ANY_STABILITY``):
    padding to the longest on one instance runs in bursts of 32 and idles between them,
    which on a busy machine moved its windows by more than 100 %."""
    extra = ("--input-data", str(data))
    before = padding_counters(metrics_port, model)
    row, error = run(model, "http", url, concurrency, settings, work, extra=extra)
    if row is None:
        loose = replace(settings, stability=ANY_STABILITY)
        row, error = run(model, "http", url, concurrency, loose, work, extra=extra)
        row = None if row is None else replace(row, stable=False)
    after = padding_counters(metrics_port, model)
    if row is None:
        raise SystemExit(f"perf_analyzer failed on {model}: {error}")
    share = (after[0] - before[0]) / max(1.0, after[1] - before[1])
    return Round(model, row.throughput, share, row.stable)


def render(
    results: list[Round], concurrency: int, settings: PaSettings, served: dict[str, str]
) -> str:
    lines = ["# Length-bucketed batching (char_lstm, lengths uniform in 8..256)", ""]
    lines += [f"- {line}" for line in machine.describe()]
    lines += [
        f"- perf_analyzer over HTTP at concurrency {concurrency}, {settings.window_ms} ms "
        f"windows; {SAMPLES} requests of lengths uniform in {SHORTEST}..{LONGEST} (seeded), "
        "the same for both; the two models take turns, one round each per row",
        "- padded share: the server's padded input elements over all the input elements "
        "the model received in that round",
        f"- instances x threads: length buckets {served[MODEL]}, pad to longest {served[PADDED]}",
        "",
        "| round | length buckets (infer/s) | padded share | pad to longest (infer/s) | "
        "padded share | buckets / padded |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    bucketed = [r for r in results if r.model == MODEL]
    padded = [r for r in results if r.model == PADDED]
    ratios = []
    for index, (b, p) in enumerate(zip(bucketed, padded, strict=True), start=1):
        ratios.append(b.throughput / p.throughput)
        lines.append(f"| {index} | {b.throughput:,.0f}{_flag(b)} | {b.padding_share:.1%} | "
                     f"{p.throughput:,.0f}{_flag(p)} | {p.padding_share:.1%} | "
                     f"{ratios[-1]:.2f} |")  # fmt: skip
    lines += [
        "",
        f"Median ratio {statistics.median(ratios):.2f}; padded share with buckets "
        f"{statistics.median(r.padding_share for r in bucketed):.1%} (median), "
        f"padding to the longest {statistics.median(r.padding_share for r in padded):.1%}.",
    ]
    return "\n".join(lines) + "\n"


def _flag(row: Round) -> str:
    return "" if row.stable else " (unstable)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--instances",
        type=int,
        default=0,
        help="CPU instances for both models (default: the load's choice)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="with --instances: threads each (default: the runtime's)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "LENGTH_BUCKETS.md")
    args = parser.parse_args()
    settings = PaSettings(args.window_ms, stability=25, max_trials=6)
    pin = (args.instances, args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-buckets-") as tmp:
        results, served = measure(args.rounds, args.concurrency, settings, Path(tmp), pin)
    args.out.write_text(render(results, args.concurrency, settings, served))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
