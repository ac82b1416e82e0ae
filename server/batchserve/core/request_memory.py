"""A bound on the bytes of requests and answers a request-handling process holds at once.

A request's body is read into memory before anything can judge it, and its answer is held
until its client has taken it, so memory grows with the requests in flight whatever the
models' budgets say: 60 concurrent 60 MiB requests to an identity model held 6.3 GiB of a
one-process server (measured on the 2-core reference machine), and a few hundred would have
the kernel kill it, every accepted request with it. Past the bound a new request is refused
at once, 503 / UNAVAILABLE as a full queue is, before its body is read where its size is
declared; what is already accepted runs on. A request that finds nothing held is admitted
whatever its size (the size limits judge it), so the bound never stops all traffic: it is
exceeded by one request at most.

The bound is ``--max-request-memory`` (a fraction of the memory the process may use, cgroup
limits included, or a size), shared evenly by the request-handling processes: each counts
only its own, with no lock between them.
"""

from __future__ import annotations

from batchserve.core.budgets import BudgetSpec, format_bytes
from batchserve.core.errors import Overloaded

DEFAULT_SHARE = BudgetSpec(fraction=0.25)
"""A quarter of the memory: with the models' own budget (``--memory-budget``, the rest of
the host), room for 48 of the largest binary requests (64 MiB, and as much again for the
answer) on 24 GiB."""

UNBOUNDED = 2**63 - 1


class RequestMemoryFull(Overloaded):
    """Requests in flight hold this process's share of ``--max-request-memory``."""


class RequestMemory:
    """Bytes held by requests in flight in this process: their bodies, then their answers."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    @classmethod
    def share(cls, spec: BudgetSpec, total_bytes: int, processes: int) -> RequestMemory:
        """One of ``processes`` request-handling processes' even share of ``spec``."""
        return cls(max(1, spec.of(total_bytes) // max(1, processes)))

    def take(self, nbytes: int) -> None:
        """Count ``nbytes`` more, or refuse them when they would pass the limit and
        something is held already."""
        if self.held and self.held + nbytes > self.limit:
            raise RequestMemoryFull(
                f"the server is out of memory for requests: {format_bytes(self.held)} held "
                f"by requests in flight, {format_bytes(self.limit)} allowed "
                "(--max-request-memory); retry later"
            )
        self.held += nbytes

    def hold(self, nbytes: int) -> None:
        """Count ``nbytes`` more without a check: an answer to a request already admitted."""
        self.held += nbytes

    def give(self, nbytes: int) -> None:
        """``nbytes`` taken or held earlier are free again."""
        self.held -= nbytes

    def ticket(self) -> Ticket:
        return Ticket(self)


class Ticket:
    """What one request counts: taken as its body comes, held for its answer, all given
    back at once when it ends, however it ends."""

    __slots__ = ("_memory", "nbytes")

    def __init__(self, memory: RequestMemory) -> None:
        self._memory = memory
        self.nbytes = 0

    def take(self, nbytes: int) -> None:
        self._memory.take(nbytes)
        self.nbytes += nbytes

    def hold(self, nbytes: int) -> None:
        self._memory.hold(nbytes)
        self.nbytes += nbytes

    def close(self) -> None:
        self._memory.give(self.nbytes)
        self.nbytes = 0
