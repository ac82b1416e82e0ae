"""The bound on requests in flight: what it admits, refuses and gives back."""

from __future__ import annotations

import pytest
from batchserve.core.budgets import BudgetSpec
from batchserve.core.errors import Overloaded
from batchserve.core.request_memory import RequestMemory, RequestMemoryFull
from batchserve.observability.refusals import Protocol, Reason, Refusals

MIB = 1 << 20


def test_requests_are_admitted_up_to_the_limit_and_refused_past_it() -> None:
    memory = RequestMemory(40 * MIB)
    memory.take(16 * MIB)
    memory.take(16 * MIB)
    with pytest.raises(RequestMemoryFull) as refused:
        memory.take(16 * MIB)
    assert refused.value.message == (
        "the server is out of memory for requests: 32 MiB held by requests in flight, 40 MiB "
        "allowed (--max-request-memory); retry later"
    )
    assert isinstance(refused.value, Overloaded)  # 503 / UNAVAILABLE, as a full queue
    assert memory.held == 32 * MIB, "a refusal counts nothing"
    memory.give(16 * MIB)
    memory.take(16 * MIB)
    assert memory.held == 32 * MIB


def test_a_request_larger_than_the_limit_is_admitted_when_nothing_is_held() -> None:
    """The size limits judge a single request; this bound only stops requests piling up."""
    memory = RequestMemory(8 * MIB)
    memory.take(64 * MIB)
    with pytest.raises(RequestMemoryFull):
        memory.take(1)


def test_an_answer_is_held_past_the_limit_and_a_ticket_gives_back_all_it_counted() -> None:
    memory = RequestMemory(10 * MIB)
    ticket = memory.ticket()
    ticket.take(6 * MIB)
    ticket.hold(6 * MIB)  # the answer of an admitted request is never refused
    assert memory.held == 12 * MIB
    with pytest.raises(RequestMemoryFull):
        memory.ticket().take(1)
    ticket.close()
    assert (memory.held, ticket.nbytes) == (0, 0)
    ticket.close()  # closing twice gives back nothing more
    assert memory.held == 0


def test_each_process_has_an_even_share() -> None:
    assert RequestMemory.share(BudgetSpec(0.25), 24 * 1024 * MIB, 4).limit == 1536 * MIB
    assert RequestMemory.share(BudgetSpec(nbytes=40 * MIB), 1 << 40, 2).limit == 20 * MIB


def test_a_refusal_is_counted_under_its_own_reason() -> None:
    refusals = Refusals()
    memory = RequestMemory(MIB)
    memory.take(MIB)
    with pytest.raises(RequestMemoryFull) as refused:
        memory.take(1)
    refusals.count_error(Protocol.HTTP, refused.value)
    assert refusals.snapshot() == {(Protocol.HTTP, Reason.REQUEST_MEMORY): 1}
