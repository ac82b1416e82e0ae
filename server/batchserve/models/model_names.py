"""What a model name may be: a plain directory name of the repository, and nothing a path
could be made of, however a layer above decodes it.

Every request names a model, so the check is cached (``name_problem``).
"""

from __future__ import annotations

import functools
import unicodedata

from batchserve.core.errors import InvalidArgument

_NAME_MAX_BYTES = 255
_FORBIDDEN_CHARACTERS = frozenset("/\\%\0")


def validate_model_name(name: str) -> str:
    """Return ``name`` if it is a plain directory name, else raise InvalidArgument.

    '%' is refused too, so that a percent-encoded traversal stays an error however many
    times a layer above decodes it.
    """
    problem = name_problem(name)
    if problem is None:
        return name
    shown = name[:64]
    if not name.strip():
        raise InvalidArgument("Model name cannot be empty. Please enter a valid name to deploy.")
    if "/" in name or "\\" in name or name.strip() == "..":  # Triton's words for these
        raise InvalidArgument(
            f"invalid model name {shown!r}, model name must not contain path traversal "
            f"characters (batchserve: {problem})"
        )
    raise InvalidArgument(f"invalid model name {shown!r}: {problem}")


def requested_model_name(name: str) -> str:
    """:func:`validate_model_name` for a name a request asks for: such a name can be no
    model, and Triton's clients look for its unknown-model text."""
    problem = name_problem(name)
    if problem is not None:
        shown = name[:64]
        raise InvalidArgument(
            f"Request for unknown model: {shown!r} is not found "
            f"(batchserve: invalid model name {shown!r}: {problem})"
        )
    return name


@functools.lru_cache(maxsize=1024)  # every request checks its model's name: ~7 µs uncached
def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a model (or file) name in the repository; None when it can."""
    if not name.strip():
        return "it is empty"
    if name != name.strip():
        return "it starts or ends with whitespace"
    if name.startswith("."):
        return "it starts with '.'"
    if _FORBIDDEN_CHARACTERS & set(name) or any(unicodedata.category(c) == "Cc" for c in name):
        return "it contains a path separator, '%' or a control character"
    if len(name.encode("utf-8", errors="replace")) > _NAME_MAX_BYTES:
        return f"it is longer than {_NAME_MAX_BYTES} bytes"
    return None
