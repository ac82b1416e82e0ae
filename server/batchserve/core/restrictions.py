"""Triton's restricted APIs: groups of endpoints that answer only requests carrying a header
with a given value (``--http-restricted-api``, ``--grpc-restricted-protocol``), so that one
credential may open inference and another model control.

A group is written ``<api>,<api>,...:<key>=<value>``; an API may be in one group only. Over
HTTP the header is ``<key>``; over gRPC it is ``triton-grpc-protocol-<key>``, as in Triton.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

CATEGORIES: Final = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
"""The groups Triton recognizes, by its names."""
GRPC_HEADER_PREFIX: Final = "triton-grpc-protocol-"


@dataclass(frozen=True, slots=True)
class Restriction:
    """The header (lower case, as both protocols deliver header names) and the value a
    request to a restricted API must carry."""

    header: str
    value: str

    def refusal(self, what: str) -> str:
        """Triton's answer to a request without the header ("API" over HTTP, "protocol"
        over gRPC)."""
        return f"This {what} is restricted, expecting header '{self.header}'"


def parse_restrictions(
    groups: Iterable[str], *, option: str, kind: str, header_prefix: str = ""
) -> Mapping[str, Restriction]:
    """Each restricted category and what it asks for; ValueError in Triton's words for a
    group that is malformed, names an unknown category, or names one already restricted.
    ``kind`` is "api" or "protocol", as Triton calls them for each option."""
    restricted: dict[str, Restriction] = {}
    for group in groups:
        names, key, value = _split(group, option, kind)
        for name in names.split(","):
            if name not in CATEGORIES:
                raise ValueError(
                    f"unknown restricted {kind} '{name}' (batchserve: {option} takes "
                    f"{', '.join(CATEGORIES)})"
                )
            if name in restricted:
                raise ValueError(
                    f"restricted {kind} '{name}' can not be specified in multiple config groups"
                )
            restricted[name] = Restriction((header_prefix + key).lower(), value)
    return restricted


def _split(group: str, option: str, kind: str) -> tuple[str, str, str]:
    """``<names>:<key>=<value>``, each part non-empty (Triton's generic option format)."""
    names, colon, setting = group.partition(":")
    key, equals, value = setting.partition("=")
    if not (colon and equals and names and key and value):
        raise ValueError(
            f"{option} option format is '<config name>:<setting>=<value>'. Got {group} "
            f"(batchserve: <{kind} 1>,<{kind} 2>,...:<header>=<value>)"
        )
    return names, key, value
