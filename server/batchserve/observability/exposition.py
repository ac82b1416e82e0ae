"""The body of ``GET /metrics``: prometheus_client's families, then Triton's as Triton writes them.

Triton's families (``nv_*``) cannot go through prometheus_client: it names a counter's series
``<name>_total``, and writes numbers of ten digits and more as ``1.7179869184e+10``, while
Triton (prometheus-cpp) writes ``nv_inference_request_success`` and ``17179869184``. The
tools written for Triton read exactly that: perf_analyzer takes GPU figures with a regular
expression of digits and an optional point, Model Analyzer and dashboards take the bare
counter names. So these families are rendered here: labels in name order, counters bare,
integral values as integers. OpenMetrics requires a counter's samples to end in ``_total``,
so in that format (which Prometheus asks for) Triton's counters are typed ``unknown``: the
series keep Triton's names, and PromQL reads them alike.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

OPENMETRICS_END = b"# EOF\n"


@dataclass(slots=True)
class Family:
    """One metric family as Triton names and types it; ``samples``: (labels, value) pairs,
    and, for a summary or histogram, the suffix of each sample's name (``_count``,
    ``_sum``, ``_bucket``) in ``suffixes`` where not empty."""

    name: str
    help: str
    kind: Literal["counter", "gauge", "summary", "histogram"]
    samples: list[tuple[Mapping[str, str], float]] = field(default_factory=list)
    suffixes: dict[int, str] = field(default_factory=dict)

    def add(self, labels: Mapping[str, str], value: float, suffix: str = "") -> None:
        if suffix:
            self.suffixes[len(self.samples)] = suffix
        self.samples.append((labels, value))


FamilySource = Callable[[], Iterable[Family]]


def render(families: Iterable[Family], *, openmetrics: bool = False) -> str:
    """The families in Triton's text format; families without samples are left out."""
    lines: list[str] = []
    for family in families:
        if not family.samples:
            continue
        kind = "unknown" if openmetrics and family.kind == "counter" else family.kind
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {kind}")
        suffixes = family.suffixes
        lines.extend(
            f"{family.name}{suffixes.get(index, '')}{_labels(labels)} {_number(value)}"
            for index, (labels, value) in enumerate(family.samples)
        )
    return "".join(line + "\n" for line in lines)


def metrics_body(
    registry: CollectorRegistry,
    triton: FamilySource | None,
    accept: str,
    accept_encoding: str,
    names: Collection[str] | None = None,
) -> tuple[bytes, list[tuple[str, str]]]:
    """The response body and headers: the format the Accept header asks for (Prometheus text
    0.0.4 without one), only the families ``names`` lists where given (the ``name[]``
    parameter), gzip where accepted."""
    encoder, content_type = choose_encoder(accept)
    openmetrics = content_type.startswith("application/openmetrics-text")
    body = encoder(registry.restricted_registry(names) if names else registry)
    if triton is not None:
        families = [f for f in triton() if not names or f.name in names]
        extra = render(families, openmetrics=openmetrics).encode()
        if openmetrics and body.endswith(OPENMETRICS_END):
            body = body[: -len(OPENMETRICS_END)] + extra + OPENMETRICS_END
        else:
            body += extra
    headers = [("Content-Type", content_type)]
    if gzip_accepted(accept_encoding):
        body = gzip.compress(body)
        headers.append(("Content-Encoding", "gzip"))
    return body, headers


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    pairs = ",".join(f'{name}="{_escape_value(labels[name])}"' for name in sorted(labels))
    return "{" + pairs + "}"


def _number(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
