"""The garbage collector set for a long-running server: startup objects frozen, young
collections rarer.

With CPython's defaults, the serving process holds ~88,000 objects the collector tracks once
its models are loaded (ONNX Runtime, grpc, FastAPI, pydantic and protobuf modules, the
configs). Under load on the 2-core reference machine (bench/NOTES.md, seventh round) a full
collection, which walks every one of them, came every two seconds and held the event loop
for 50-65 ms; young collections came every ~35 requests and cost 0.15-0.3 ms each.

- ``settle`` freezes what exists after the set of loaded models changes (``gc.freeze``):
  later collections skip it, so a full one walks thousands of objects, not ~90,000. It
  unfreezes and collects first, so the cycles a model left behind when it was unloaded or
  replaced are still freed.
- ``tune`` raises the young generation's threshold. Reference counting frees everything a
  request allocates as soon as the answer leaves; the collector only finds cycles, and the
  only ones on the request path are grpc.aio's own (five small objects a call), so scanning
  the requests still in flight every 700 allocations was nearly all cost.
"""

from __future__ import annotations

import gc
import logging
import time

logger = logging.getLogger(__name__)

YOUNG_THRESHOLD = 10_000
"""Net allocations of tracked objects between young collections (CPython's default: 700)."""


def tune(young_threshold: int = YOUNG_THRESHOLD) -> None:
    """Collect the young generation every ``young_threshold`` allocations; the older
    generations keep their thresholds (counted in young collections)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)


def settle() -> None:
    """Free the cycles that exist now, then keep every survivor out of later collections."""
    started = time.perf_counter()
    gc.unfreeze()
    collected = gc.collect()
    gc.freeze()
    logger.info(
        "heap frozen",
        extra={
            "frozen_objects": gc.get_freeze_count(),
            "collected_objects": collected,
            "collect_ms": round((time.perf_counter() - started) * 1e3, 1),
        },
    )
