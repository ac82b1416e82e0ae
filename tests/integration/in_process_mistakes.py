"""The bad requests ``test_in_process.py`` sends both to ``batchserve.Server`` (in a process
of its own, ``in_process_answers.py``) and over HTTP. Plain data: the integration suite's
process imports it, and must not import the server's protobuf modules beside tritonclient's.
"""

from __future__ import annotations

from typing import Any

DIGITS = "digits_cnn"
MISTAKES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # name: (model, inputs as (dtype, shape), infer options)
    "wrong input name": (DIGITS, {"imag": ("float32", (1, 1, 8, 8))}, {}),
    "wrong datatype": (DIGITS, {"image": ("float64", (1, 1, 8, 8))}, {}),
    "wrong shape": (DIGITS, {"image": ("float32", (1, 8, 8))}, {}),
    "unknown output": (DIGITS, {"image": ("float32", (1, 1, 8, 8))}, {"outputs": ["logit"]}),
    "unknown model": ("digit_cnn", {"image": ("float32", (1, 1, 8, 8))}, {}),
    "decoupled model": ("square_int32", {"IN": ("int32", (1,))}, {}),
}
