"""The model-owning process's ceiling with ``--workers``: the requests a second it takes
from workers that are not the limit, its CPU per request then, and how large the groups
grew.

    python -m bench.model_owner [--feeders 1] [--concurrency 64] [--seconds 5]
                                [--out bench/MODEL_OWNER.md]

This process is the model-owning one, built from the server's own parts (``Server``'s
data plane, batchers and one ``EngineLink`` per feeder). Each feeder is a process running
the workers' own hand-off code (``WorkerPlane.infer``) over a real socket pair and memfd
arenas, on requests decoded once: no HTTP or gRPC in front, so it hands requests over faster
than one process takes them, which is what a node with many workers does. CPU is this
process's (every thread: the event loop and ONNX Runtime's) over the window, divided by the
requests the links counted.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import uvloop
from batchserve.core.settings import Settings
from batchserve.core.types import InferRequest, Tensor
from batchserve.dataplane.handoff.arena import Arena
from batchserve.dataplane.handoff.engine_link import EngineLink
from batchserve.dataplane.handoff.worker_plane import WorkerPlane
from batchserve.models.model_table import ServedVersion
from batchserve.runtime.app import Server

from bench import machine
from bench.common import ROOT
from bench.repo import write_identity

MODELS = ("identity", "digits_cnn")
ARENA_BYTES = 64 << 20
WARM_UP_S = 2.0


@dataclass(frozen=True)
class Ceiling:
    model: str
    feeders: int
    concurrency: int
    """Requests each feeder keeps in flight."""
    spread_us: int
    """Each request waits up to this long (uniform) after its predecessor's answer."""
    throughput: float
    owner_us: float
    """CPU per request in the model-owning process (all its threads)."""
    compute_us: float
    """Of which the model's own run (the batcher's compute time, per request)."""
    per_handoff: float
    """Requests per frame from a worker: the mean group."""


# the feeder process -----------------------------------------------------------------
async def _feed(
    sock: socket.socket,
    requests_fd: int,
    responses_fd: int,
    model: str,
    concurrency: int,
    spread_s: float,
) -> None:
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    requests, responses = Arena(requests_fd, ARENA_BYTES), Arena(responses_fd, ARENA_BYTES)
    plane = WorkerPlane(Settings(), requests, responses)
    await loop.connect_accepted_socket(lambda: plane.protocol, sock)
    while not plane.knows(model, ""):
        await asyncio.sleep(0.01)
    (rule,) = plane.schema_lookup(model, "")().inputs
    shape = (1, *rule.dims[1:])
    data = np.random.default_rng(0).random(shape).astype(rule.datatype.numpy)

    async def client(seed: int) -> None:
        pause = np.random.default_rng(seed)
        while True:
            if spread_s:  # as a front end's callers do: not all in the same pass
                await asyncio.sleep(pause.uniform(0, spread_s))
            tensor = Tensor(rule.name, rule.datatype, shape, data)
            await plane.infer(InferRequest(model, inputs=[tensor]))

    clients = [asyncio.create_task(client(seed)) for seed in range(concurrency)]
    plane.protocol.send(("h",))
    await plane.lost
    for task in clients:
        task.cancel()


def _feeder_main(args: list[str]) -> int:
    sock_fd, requests_fd, responses_fd, concurrency, spread_us = (int(arg) for arg in args[:5])
    sock = socket.socket(fileno=sock_fd)
    uvloop.run(_feed(sock, requests_fd, responses_fd, args[5], concurrency, spread_us / 1e6))
    return 0


# the model-owning side ----------------------------------------------------------------
async def measure(
    repo: Path, model: str, feeders: int, concurrency: int, spread_us: int, seconds: float
) -> Ceiling:
    settings = Settings(
        model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, workers="1"
    )
    server = Server(settings)
    await server.registry.load(model)
    served = server.dataplane.served(model, "")
    loop = asyncio.get_running_loop()
    links, processes = [], []
    for index in range(feeders):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        requests = Arena.create(f"feeder{index}-requests", ARENA_BYTES)
        responses = Arena.create(f"feeder{index}-responses", ARENA_BYTES)
        fds = (theirs.fileno(), requests.fd, responses.fd)
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "bench.model_owner", "--feed", *map(str, fds),
             str(concurrency), str(spread_us), model],
            pass_fds=fds, cwd=ROOT,
        ))  # fmt: skip
        theirs.close()
        link = EngineLink(index, server.dataplane, requests, responses, lambda i, f: None)
        await loop.connect_accepted_socket(partial(_protocol_of, link), ours)
        links.append(link)
    try:
        await asyncio.gather(*(link.listening for link in links))
        await asyncio.sleep(WARM_UP_S)
        start = _snapshot(links, served)
        await asyncio.sleep(seconds)
        end = _snapshot(links, served)
    finally:
        for process in processes:
            process.kill()
            process.wait()
        await server.registry.close()
    answered, handoffs = end[0] - start[0], end[1] - start[1]
    return Ceiling(
        model, feeders, concurrency, spread_us,
        throughput=answered / (end[2] - start[2]),
        owner_us=(end[3] - start[3]) * 1e6 / answered,
        compute_us=(end[4] - start[4]) / 1e3 / answered,
        per_handoff=answered / handoffs,
    )  # fmt: skip


def _protocol_of(link: EngineLink) -> asyncio.Protocol:
    return link.protocol


def _snapshot(links: list[EngineLink], served: ServedVersion) -> tuple[int, int, float, float, int]:
    stats = served.stats
    compute = sum(
        s.compute_input.ns + s.compute_infer.ns + s.compute_output.ns
        for s in stats.batches.values()
    )
    return (
        sum(link.handed_over for link in links),
        sum(link.handoffs for link in links),
        time.perf_counter(),
        time.process_time(),
        compute,
    )


def render(ceilings: list[Ceiling], seconds: float) -> str:
    lines = ["# The model-owning process's ceiling (`--workers`)", ""]
    lines += [f"- {line}" for line in machine.describe()]
    lines += [
        f"- `python -m bench.model_owner`: {seconds:.0f} s windows after {WARM_UP_S:.0f} s of "
        "warm-up; feeders run the workers' hand-off code with no HTTP or gRPC in front",
        "",
        "| model | feeders | requests in flight each | pause before each (µs, up to) | "
        "throughput (req/s) | model-owning process µs CPU/request | of which the model's run "
        "| requests per frame |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in ceilings:
        lines.append(f"| {c.model} | {c.feeders} | {c.concurrency} | {c.spread_us} | "
                     f"{c.throughput:,.0f} | "
                     f"{c.owner_us:.1f} | {c.compute_us:.1f} | {c.per_handoff:.1f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--feed":
        return _feeder_main(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--feeders", default="1")
    parser.add_argument("--concurrency", default="8,64")
    parser.add_argument("--spread-us", default="0,2000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "MODEL_OWNER.md")
    args = parser.parse_args()
    ceilings = []
    with tempfile.TemporaryDirectory(prefix="bench-owner-") as tmp:
        repo = Path(tmp)
        shutil.copytree(ROOT / "model_repo" / "digits_cnn", repo / "digits_cnn")
        write_identity(repo)
        for model in MODELS:
            for feeders in (int(n) for n in args.feeders.split(",")):
                for concurrency in (int(n) for n in args.concurrency.split(",")):
                    for spread in (int(n) for n in args.spread_us.split(",")):
                        ceiling = uvloop.run(
                            measure(repo, model, feeders, concurrency, spread, args.seconds)
                        )
                        print(ceiling, flush=True)
                        ceilings.append(ceiling)
    args.out.write_text(render(ceilings, args.seconds))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
