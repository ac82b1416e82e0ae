"""The waiting rules of ``max_queue_delay`` on their own, on a hand-advanced clock.

``wait_until`` answers None to go now, or the time to look again.
"""

from __future__ import annotations

from batchserve.scheduler.dispatch_timing import QUIET_GAPS, DispatchTiming
from batchserve.scheduler.timing import ArrivalGaps
from fakes import ManualClock

US = 1_000
DELAY_NS = 1000 * US


def _busy(clock: ManualClock, gap_ns: int, count: int, delay_ns: int = DELAY_NS) -> DispatchTiming:
    """Rules that have seen ``count`` arrivals ``gap_ns`` apart, each finding others queued
    (so ``gap_ns`` is the expected gap); then the queue emptied and a long pause."""
    timing = DispatchTiming(delay_ns)
    timing.arrived(clock(), joined=False, new_pass=True)
    for _ in range(count):
        clock.advance(gap_ns)
        timing.arrived(clock(), joined=True, new_pass=True)
    timing.emptied()
    assert timing.gaps.expected_gap_ns() == gap_ns
    clock.advance(100 * DELAY_NS)
    return timing


def _arrive(timing: DispatchTiming, clock: ManualClock, *, joined: bool) -> int:
    timing.arrived(clock(), joined=joined, new_pass=True)
    return clock()


def test_until_company_has_been_seen_nothing_waits() -> None:
    clock = ManualClock()
    timing = DispatchTiming(DELAY_NS)
    for _ in range(20):  # one closed-loop client: its requests never find another queued
        oldest = _arrive(timing, clock, joined=False)
        assert timing.wait_until(clock(), oldest, 1) is None
        timing.emptied()
        clock.advance(100 * US)


def test_a_request_waits_for_quiet_when_company_is_expected() -> None:
    clock = ManualClock()
    timing = _busy(clock, 10 * US, 4)
    oldest = _arrive(timing, clock, joined=False)
    assert timing.wait_until(clock(), oldest, 1) == oldest + QUIET_GAPS * 10 * US


def test_nothing_waits_when_no_company_can_come_within_the_delay() -> None:
    clock = ManualClock()
    timing = _busy(clock, 1100 * US, 4)  # the expected gap is longer than the delay
    oldest = _arrive(timing, clock, joined=False)
    assert timing.wait_until(clock(), oldest, 1) is None


def test_a_burst_waits_until_arrivals_stop_for_quiet_gaps() -> None:
    clock = ManualClock()
    timing = _busy(clock, 10 * US, 4)
    oldest = _arrive(timing, clock, joined=False)
    for queued in (2, 3):
        clock.advance(10 * US)
        last = _arrive(timing, clock, joined=True)
        assert timing.wait_until(clock(), oldest, queued) == last + 2 * 10 * US
    clock.advance(2 * 10 * US - 1)  # one nanosecond short of two gaps of silence
    assert timing.wait_until(clock(), oldest, 3) == last + 2 * 10 * US
    clock.advance(1)
    assert timing.wait_until(clock(), oldest, 3) is None


def test_the_max_queue_delay_is_never_exceeded() -> None:
    clock = ManualClock()
    timing = _busy(clock, 10 * US, 4, delay_ns=50 * US)
    oldest = _arrive(timing, clock, joined=False)
    for queued in range(2, 6):  # never quiet: an arrival every expected gap
        clock.advance(10 * US)
        _arrive(timing, clock, joined=True)
        due = timing.wait_until(clock(), oldest, queued)
        assert due is not None
        assert due <= oldest + 50 * US
    assert due == oldest + 50 * US  # 40 us in: the delay ends before quiet would
    clock.advance(10 * US)
    assert timing.wait_until(clock(), oldest, 5) is None


def test_while_answered_clients_are_still_to_come_only_they_or_the_delay_end_the_wait() -> None:
    clock = ManualClock()
    timing = _busy(clock, 10 * US, 4)
    timing.answered(3)
    oldest = _arrive(timing, clock, joined=False)
    clock.advance(10 * US)
    _arrive(timing, clock, joined=True)
    clock.advance(100 * US)  # ten gaps of silence, but one answered client is not back
    assert timing.wait_until(clock(), oldest, 2) == oldest + DELAY_NS
    assert timing.returning == 1
    clock.advance(oldest + DELAY_NS - clock())
    assert timing.wait_until(clock(), oldest, 2) is None
    assert timing.returning == 0  # not back by the delay: no longer expected


def test_once_every_answered_client_is_back_the_batch_goes_until_the_queue_empties() -> None:
    clock = ManualClock()
    timing = _busy(clock, 10 * US, 4)
    timing.answered(2)
    oldest = _arrive(timing, clock, joined=False)
    assert timing.wait_until(clock(), oldest, 1) is not None  # one is still to come
    clock.advance(10 * US)
    _arrive(timing, clock, joined=True)
    assert timing.wait_until(clock(), oldest, 2) is None  # company expected, but all back
    assert timing.wait_until(clock(), oldest, 1) is None  # (the rest of that queue too)
    timing.emptied()
    clock.advance(10 * US)
    oldest = _arrive(timing, clock, joined=False)
    assert timing.wait_until(clock(), oldest, 1) is not None  # nobody answered is back now


def test_requests_of_one_loop_pass_are_one_arrival_but_each_a_returning_client() -> None:
    clock = ManualClock()
    timing = _busy(clock, 10 * US, 4)
    timing.answered(2)
    first = _arrive(timing, clock, joined=False)
    clock.advance(3 * US)
    timing.arrived(clock(), joined=True, new_pass=False)
    assert timing.gaps.last_ns == first
    assert timing.gaps.expected_gap_ns() == 10 * US  # no 3 us gap was seen
    assert timing.returning == 0
    assert timing.wait_until(clock(), first, 2) is None  # both answered clients are back


def test_returning_clients_are_counted_by_request_whatever_items_carry_them() -> None:
    """A worker hands several requests over as one item, and the clients of one answered
    batch come back grouped differently: two items of three answered, then one of six back,
    is every client back (counting items, four would still be expected and the batch would
    sit out the whole delay)."""
    clock = ManualClock()
    timing = _busy(clock, 10 * US, 4)
    timing.answered(6)
    oldest = _arrive(timing, clock, joined=False)
    timing.returning = 6  # as answered: nothing came back yet
    timing.arrived(clock(), joined=False, new_pass=False, clients=5)
    assert timing.returning == 1
    assert timing.wait_until(clock(), oldest, 2) is not None  # one client is still to come
    clock.advance(10 * US)
    timing.arrived(clock(), joined=True, new_pass=True, clients=4)  # more than were expected
    assert timing.returning == 0
    assert timing.wait_until(clock(), oldest, 3) is None


def test_a_lone_request_made_to_wait_in_vain_teaches_that_company_is_rarer() -> None:
    clock = ManualClock()
    timing = _busy(clock, 10 * US, 4)
    oldest = _arrive(timing, clock, joined=False)
    due = timing.wait_until(clock(), oldest, 1)
    assert due == oldest + 20 * US
    clock.advance(due - clock())
    assert timing.wait_until(clock(), oldest, 1) is None
    lonely = ArrivalGaps.LONELY_FACTOR * 20 * US  # a censored gap: longer than the wait
    assert timing.gaps.expected_gap_ns() == 10 * US + (lonely - 10 * US) * ArrivalGaps.WEIGHT


def test_a_lone_client_is_not_delayed_once_the_load_has_gone() -> None:
    clock = ManualClock()
    timing = _busy(clock, 10 * US, 8)
    waited = []
    for _ in range(30):  # one client alone after a busy spell: nobody joins its requests
        clock.advance(5 * DELAY_NS)
        oldest = _arrive(timing, clock, joined=False)
        due = timing.wait_until(clock(), oldest, 1)
        waited.append(due is not None)
        if due is not None:  # rounded down from a quiet time that is now fractional
            clock.advance(due - clock() + 1)
            assert timing.wait_until(clock(), oldest, 1) is None
        timing.emptied()
    assert waited[0]
    assert not any(waited[20:])


def test_a_batch_that_went_ready_or_with_company_teaches_nothing() -> None:
    clock = ManualClock()
    timing = _busy(clock, 10 * US, 4)
    oldest = _arrive(timing, clock, joined=False)
    assert timing.wait_until(clock(), oldest, 1) is not None
    timing.went_ready()  # it reached a preferred size: not kept waiting by these rules
    clock.advance(20 * US)
    assert timing.wait_until(clock(), oldest, 1) is None
    assert timing.gaps.expected_gap_ns() == 10 * US
    timing.emptied()
    clock.advance(5 * DELAY_NS)
    oldest = _arrive(timing, clock, joined=False)
    clock.advance(10 * US)
    _arrive(timing, clock, joined=True)
    assert timing.wait_until(clock(), oldest, 2) is not None
    clock.advance(20 * US)
    assert timing.wait_until(clock(), oldest, 2) is None  # it went with company
    assert timing.gaps.expected_gap_ns() == 10 * US


def test_clients_given_up_on_at_a_stall_still_count_when_they_come_back() -> None:
    """The busy-machine collapse, replayed from a traced run (32 gRPC clients, another process
    on the cores): after a batch of 32 is answered the machine stalls; two clients come
    back 37 ms and 53 ms later, and the batch goes at its 25 ms delay with thirty clients
    not back. Were those forgotten, the two answered next would be "all back" as soon as
    any two requests came, and every later batch would be two as well (the traced run went
    on so for seconds)."""
    clock = ManualClock()
    timing = _busy(clock, 180 * US, 31, delay_ns=25_000 * US)
    timing.answered(32)
    clock.advance(37_000 * US)
    oldest = _arrive(timing, clock, joined=False)
    clock.advance(16_000 * US)
    _arrive(timing, clock, joined=True)
    assert timing.gaps.expected_gap_ns() < 300 * US  # a 16 ms gap counts as 4 expected ones
    clock.advance(9_000 * US)
    assert timing.wait_until(clock(), oldest, 2) is None  # the delay is out
    timing.emptied()
    timing.answered(2)
    clock.advance(200 * US)
    oldest = _arrive(timing, clock, joined=False)
    clock.advance(200 * US)
    _arrive(timing, clock, joined=True)
    assert timing.wait_until(clock(), oldest, 2) is not None  # not everyone is back
    for queued in range(3, 33):  # the thirty come back
        clock.advance(200 * US)
        _arrive(timing, clock, joined=True)
        if queued < 32:
            assert timing.wait_until(clock(), oldest, queued) is not None
    assert timing.wait_until(clock(), oldest, 32) is None  # all back: the batch is whole


def test_clients_that_left_stop_counting_within_a_few_batches() -> None:
    """Half of those overdue count as gone at each batch that goes without them: when 24
    of 32 clients leave for good, the 8 that stay are all back at once after five."""
    clock = ManualClock()
    timing = _busy(clock, 10 * US, 8)
    timing.overdue = 24
    sent_by_quiet = 0
    for _ in range(8):
        timing.answered(8)
        clock.advance(100 * US)
        oldest = _arrive(timing, clock, joined=False)
        for _ in range(7):
            clock.advance(5 * US)
            _arrive(timing, clock, joined=True)
        due = timing.wait_until(clock(), oldest, 8)
        if due is not None:
            sent_by_quiet += 1
            clock.advance(due - clock() + 1)  # rounded down from a fractional quiet time
            assert timing.wait_until(clock(), oldest, 8) is None
        timing.emptied()
    assert sent_by_quiet == 5  # 24 -> 12 -> 6 -> 3 -> 1 -> 0
    assert timing.overdue == 0


def test_two_requests_decoded_in_one_pass_are_company_when_none_was_ever_seen() -> None:
    """The start of a 32-client run on a busy machine, replayed: each request ran on the event
    loop before the next was decoded, so none ever found another queued and, company never
    seen, nothing waited (batches of one for 5 s, the other clients' requests waiting in
    the sockets). A pass that decodes two shows company within one pass gap, so the
    clients answered next are waited for."""
    clock = ManualClock()
    timing = DispatchTiming(DELAY_NS)
    for _ in range(10):  # one request a pass, each answered before the next pass
        oldest = _arrive(timing, clock, joined=False)
        assert timing.wait_until(clock(), oldest, 1) is None
        timing.emptied()
        timing.answered(1)
        clock.advance(300 * US)
    oldest = _arrive(timing, clock, joined=False)
    timing.arrived(clock(), joined=True, new_pass=False)  # two in one pass
    assert timing.gaps.expected_gap_ns() == 300 * US
    assert timing.wait_until(clock(), oldest, 2) is None  # the one answered is back
    timing.emptied()
    timing.answered(2)
    clock.advance(300 * US)
    oldest = _arrive(timing, clock, joined=False)
    assert timing.wait_until(clock(), oldest, 1) is not None  # the other is coming
    clock.advance(300 * US)
    _arrive(timing, clock, joined=True)
    assert timing.wait_until(clock(), oldest, 2) is None


def test_clients_answered_after_all_came_back_are_waited_for() -> None:
    """Traced with two processes burning the cores: the last late client came back while a
    batch of 29 ran; when that batch was answered, the one request queued went alone at once
    ("all back"), and the 32 clients went on in two groups, of 29 and of 1, each repeating
    its size."""
    clock = ManualClock()
    timing = _busy(clock, 100 * US, 4)
    timing.answered(1)
    oldest = _arrive(timing, clock, joined=False)  # all back, while a batch of 29 runs
    timing.answered(29)
    assert timing.wait_until(clock(), oldest, 1) is not None  # the 29 are coming back


def test_waiting_out_the_delay_ignores_every_rule_that_ends_it_sooner() -> None:
    """Triton's rule (``--wait-out-queue-delay``): the batch goes only once its oldest
    request has waited the whole delay, even where the adaptive rules would send it at
    once (no company seen yet; company rarer than the delay; every answered client back)."""
    clock = ManualClock()
    fresh = DispatchTiming(DELAY_NS, wait_out=True)
    oldest = _arrive(fresh, clock, joined=False)
    assert fresh.wait_until(clock(), oldest, 1) == oldest + DELAY_NS
    assert DispatchTiming(DELAY_NS).wait_until(clock(), oldest, 1) is None  # adaptive: goes
    rare = _busy(clock, 1100 * US, 4)
    rare.wait_out = True
    oldest = _arrive(rare, clock, joined=False)
    clock.advance(DELAY_NS - 1)
    assert rare.wait_until(clock(), oldest, 1) == oldest + DELAY_NS
    clock.advance(1)
    assert rare.wait_until(clock(), oldest, 1) is None
    back = _busy(clock, 10 * US, 4)
    back.wait_out = True
    back.answered(1)
    oldest = _arrive(back, clock, joined=False)  # the one answered client is back
    assert back.wait_until(clock(), oldest, 1) == oldest + DELAY_NS


def test_waiting_out_the_delay_still_goes_when_the_objective_allows_no_more() -> None:
    clock = ManualClock()
    timing = DispatchTiming(DELAY_NS, wait_out=True)
    oldest = _arrive(timing, clock, joined=False)
    assert timing.wait_until(clock(), oldest, 1, oldest + 300 * US) == oldest + 300 * US
    clock.advance(300 * US)
    assert timing.wait_until(clock(), oldest, 1, oldest + 300 * US) is None
    assert timing.fresh().wait_out
