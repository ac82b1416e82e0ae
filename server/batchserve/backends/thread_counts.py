"""Thread counts a model's config names (Triton's parameters for ONNX Runtime and PyTorch),
read as Triton reads them and bounded by the host.

Triton parses the value as an integer and applies it only when positive; zero or less leaves
the pool to the runtime, and text that is not an integer fails the load. A count above the
host's CPUs is lowered to them, with a warning: more threads than CPUs never run at once,
and a count in the thousands is not a setting but a way to stop the server: with 100000, an
ONNX Runtime session had not finished loading after two minutes, and torch's OpenMP pool
crashed the process (a segmentation fault) at its first batch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from batchserve.core.errors import ModelConfigError

_log = logging.getLogger(__name__)


def named_thread_count(params: Mapping[str, str], key: str, model_file: Path) -> int:
    """The count ``params[key]`` names: 0 where it names none (or zero or less), at most the
    host's CPUs; ModelConfigError for text that is not an integer."""
    if key not in params:
        return 0
    text = params[key].strip()
    try:
        count = int(text)
    except ValueError:
        raise ModelConfigError(
            f"{model_file}: parameter {key}={text!r} is not a whole number of threads"
        ) from None
    host = os.cpu_count() or 1
    if count > host:
        _log.warning(
            "%s: parameter %s=%d is more threads than this machine's %d CPUs; %d used",
            model_file, key, count, host, host,
        )  # fmt: skip
        return host
    return max(0, count)
