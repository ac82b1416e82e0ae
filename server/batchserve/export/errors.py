"""Why an export stopped: the model cannot be exported (exit 2) or its numbers do not match (1)."""

from __future__ import annotations

from batchserve.core.errors import ModelConfigError


class ExportError(ModelConfigError):
    """The module, its signature or a conversion step is at fault; the message says which."""


class VerificationFailed(ExportError):
    """The converted model ran but disagreed with PyTorch beyond the tolerance."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (runtimes add pages of context), or its type."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
