"""A bound on the gRPC calls served at once, so a flood is refused where it is counted.

grpc core would otherwise queue or drop the excess itself (see ``options.bounded_backlog``),
and an open stream holds a task and its buffers for as long as the client keeps it.
"""

from __future__ import annotations

import grpc

from batchserve.observability.refusals import REFUSALS, Protocol, Reason


class CallLimit:
    """Counts calls in flight; a call over ``limit`` is refused with UNAVAILABLE, the code
    clients retry on (the status of a full model queue too)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0

    def enter(self) -> bool:
        """Admit a call (the caller must ``leave`` once it ends), or count its refusal."""
        if self.active >= self.limit:
            REFUSALS.count(Protocol.GRPC, Reason.TOO_MANY_CALLS)
            return False
        self.active += 1
        return True

    def leave(self) -> None:
        self.active -= 1

    @property
    def refusal(self) -> tuple[grpc.StatusCode, str]:
        """The status and message of a refused call."""
        message = f"too many concurrent gRPC calls (limit {self.limit}): retry later"
        return grpc.StatusCode.UNAVAILABLE, message
