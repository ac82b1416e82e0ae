"""Shared checks for the layout caches: decoded requests compared, full decodes counted."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from batchserve.core.types import InferRequest


def count_full_decodes(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> list[Any]:
    """The first argument of each call ``module`` makes to its full decoder, which still
    does all the decoding."""
    calls: list[Any] = []
    real: Callable[..., InferRequest] = module.decode_infer_request

    def counted(first: Any, *args: Any) -> InferRequest:
        calls.append(first)
        return real(first, *args)

    monkeypatch.setattr(module, "decode_infer_request", counted)
    return calls


def assert_same_request(a: InferRequest, b: InferRequest) -> None:
    """Equal in everything but the layout token, with read-only input arrays."""
    assert [(t.name, t.datatype, t.shape, t.parameters) for t in a.inputs] == [
        (t.name, t.datatype, t.shape, t.parameters) for t in b.inputs
    ]
    for x, y in zip(a.inputs, b.inputs, strict=True):
        np.testing.assert_array_equal(x.data, y.data)
        assert x.data.dtype == y.data.dtype
        assert not x.data.flags.writeable
    fields = ("model_name", "model_version", "id", "outputs", "parameters", "priority",
              "timeout_us", "binary_output", "protocol")  # fmt: skip
    assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
