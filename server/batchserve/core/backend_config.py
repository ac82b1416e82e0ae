"""Triton's ``--backend-config [<backend>,]<setting>=<value>`` entries, parsed once at start.

Triton hands each backend its settings; batchserve's backends are built in, and the one
setting that changes what a model is served with is ``default-max-batch-size``: the batch
size a config completed from its model file gets (Triton's backends give 4, batchserve 32
unless told). It may be given for one backend (``onnxruntime,default-max-batch-size=8``) or
for all (``default-max-batch-size=8``); the backend's own wins. Every other setting is
checked for its form and left alone, as a backend that does not know a setting ignores it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

DEFAULT_MAX_BATCH_SIZE = "default-max-batch-size"
GLOBAL = ""
"""The backend of a setting given for every backend."""

BackendConfig = Mapping[tuple[str, str], str]
"""Each (backend, setting) pair's value; backend ``GLOBAL`` for every backend."""


def parse_backend_config(entries: Sequence[str]) -> BackendConfig:
    """The entries by backend and setting (a later one wins); ValueError in Triton's words
    for an entry not of its form, and for a default batch size that is not a count."""
    settings: dict[tuple[str, str], str] = {}
    for entry in entries:
        shown = entry[:128]
        comma = entry.find(",")
        if comma == 0:
            raise ValueError(
                "No backend specified. --backend-config option format is <backend name>,"
                f"<setting>=<value> or <setting>=<value>. Got {shown}"
            )
        backend = entry[:comma] if comma > 0 else GLOBAL
        setting, equals, value = entry[comma + 1 :].partition("=")
        if not equals or not setting or not value:
            raise ValueError(
                f"--backend-config option format is '<backend name>,<setting>=<value>'. Got {shown}"
            )
        if setting == DEFAULT_MAX_BATCH_SIZE and not (value.isascii() and value.isdigit()):
            raise ValueError(f"--backend-config {shown!r}: {setting} must be a count (0 or more)")
        settings[backend, setting] = value
    return settings


def default_max_batch_size(config: BackendConfig, backend: str, fallback: int) -> int:
    """The batch size a completed config of ``backend`` gets: the backend's own setting,
    else the one for every backend, else ``fallback``."""
    value = config.get(
        (backend, DEFAULT_MAX_BATCH_SIZE), config.get((GLOBAL, DEFAULT_MAX_BATCH_SIZE))
    )
    return fallback if value is None else int(value)
