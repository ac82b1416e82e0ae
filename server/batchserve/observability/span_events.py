"""Triton's timestamps as OpenTelemetry span events, on the spans Triton puts them on.

Triton's OpenTelemetry mode records each trace timestamp as an event named as in its trace
files: the request's receipt and send (and ``INFER_RESPONSE_COMPLETE``) on the root span,
``REQUEST_START``, ``QUEUE_START`` and ``REQUEST_END`` on the model's span, the
``COMPUTE_*`` stamps on ``compute``. batchserve's spans are its request's phases, so the
model's events go on ``infer`` (and on each ensemble step's span); a tool that reads Triton's
events by name finds them on the spans it expects.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.trace import Span

ROOT_EVENTS = frozenset({
    "HTTP_RECV_START", "HTTP_RECV_END", "GRPC_WAITREAD_START", "GRPC_WAITREAD_END",
    "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END", "GRPC_SEND_START",
    "GRPC_SEND_END",
})  # fmt: skip
MODEL_EVENTS = frozenset({"REQUEST_START", "QUEUE_START", "REQUEST_END"})
COMPUTE_EVENTS = frozenset(
    {"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"}
)


def add_events(
    span: Span, stamps: Iterable[tuple[str, int]], names: frozenset[str], wall: int
) -> None:
    """The stamps among ``names`` as events of ``span`` (``wall``: monotonic to wall ns)."""
    for name, ns in stamps:
        if name in names:
            span.add_event(name, timestamp=ns + wall)
