"""How long an HTTP client may take to send its request and to take its answer, and what
becomes of a request still arriving when the server shuts down.

uvicorn times out only the idle gap after a response (keep-alive): a connection that never
sends a byte, or sends one a second, is held for ever, and a few hundred of them exhaust the
process's descriptors. As Apache's mod_reqtimeout (``header=20 body=20,MinRate=500``):

- the request line and headers must arrive within ``header_seconds``, counted from the
  connection's opening or from the first byte of a later request on it;
- the body must arrive by ``start + body_seconds + bytes received / body_min_rate``, so a
  large upload at a fair rate is never cut off, and a trickle is.

Time the server holds the request back (reading paused because the application has not
taken the body yet, or a ``100 Continue`` it has not sent) is not counted against the client.

One timer per connection: data only moves the deadline later, so the timer is re-armed when
it fires early, never per chunk received.

An answer the client stops taking holds its bytes in the server, and its request's share of
``--max-request-memory``, for as long as the connection stays open. As nginx's
``send_timeout`` (60 s), a connection whose writes stay paused (the transport's buffer over
its high-water mark, never drained to its low-water mark) for ``send_seconds`` is aborted,
its buffered answer dropped.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from uvicorn.protocols.http.flow_control import FlowControl

from batchserve.observability.refusals import REFUSALS, Reason
from batchserve.rest.connection_refusals import RefusingProtocol

SHUTTING_DOWN = "server is shutting down"
SHUTDOWN_BODY_GRACE_SECONDS = 1.0
"""How long a body still arriving at shutdown may take to finish before its 503: time for a
request already on the wire (a client writes head and body apart), not for a trickle."""
STALL_SECONDS = 0.5
"""A timer this late means the event loop was held up, and bytes may be waiting unread."""


@dataclass(frozen=True, slots=True)
class ReadTimeouts:
    """One listener's limits on the time a client takes to send a request."""

    header_seconds: float = 20.0
    body_seconds: float = 20.0
    body_min_rate: float = 500.0
    """Bytes per second of body that each earn the client more time."""


class PauseTimingFlowControl(FlowControl):
    """uvicorn's flow control, adding up how long reading has been paused: time the server,
    not the client, held the request back."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(transport)
        self._loop = loop
        self._paused_since = 0.0
        self.paused_total = 0.0
        """Seconds of the pauses that have ended."""

    # Whole rather than around super(): resume_reading runs twice a request.
    def pause_reading(self) -> None:
        if not self.read_paused:
            self._paused_since = self._loop.time()
            self.read_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.paused_total += self._loop.time() - self._paused_since
            self.read_paused = False
            self._transport.resume_reading()

    def paused_seconds(self, now: float) -> float:
        """Seconds reading has been paused since the connection opened, up to ``now``."""
        if self.read_paused:
            return self.paused_total + now - self._paused_since
        return self.paused_total


# What the connection is waiting for from its client. Plain ints: these are compared a few
# times per request, and an Enum member's lookup costs several times as much.
_NOTHING = 0  # a request is being served, or uvicorn's keep-alive timer runs
_HEAD = 1
_BODY = 2


class SendTimeoutProtocol(RefusingProtocol):
    """Aborts a connection whose client has not taken its answer for ``send_seconds``."""

    send_seconds: ClassVar[float] = 60.0
    """This listener's limit: each server sets its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._send_timer: asyncio.TimerHandle | None = None

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.send_seconds, self._answer_not_taken)

    def resume_writing(self) -> None:
        self._stop_send_timer()
        super().resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_send_timer()
        super().connection_lost(exc)

    def _stop_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _answer_not_taken(self) -> None:
        """Count it and abort: closing would wait for the buffer to drain, which it never
        does. The application sees a disconnect, and its send returns."""
        self._send_timer = None
        if self.transport.is_closing():
            return
        REFUSALS.count(self.listener, Reason.SEND_TIMEOUT)
        self.transport.abort()


class ReadTimeoutProtocol(RefusingProtocol):
    """Closes a connection whose client is too slow to send its request: 408 when part of
    it came, silently when nothing did; at shutdown, 503 for a request still arriving."""

    read_timeouts: ClassVar[ReadTimeouts] = ReadTimeouts()
    """This listener's limits: each server sets its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading = _NOTHING
        self._started = 0.0  # loop time the current wait began
        self._paused_before = 0.0  # the flow's paused seconds when it began
        self._received = False  # any byte of the request being waited for
        self._body_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._refuse_body_at: float | None = None  # set at shutdown while a body arrives
        self._flow: PauseTimingFlowControl  # self.flow, typed as what it is

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(cast(asyncio.Transport, transport))
        self.flow = self._flow = self.flow_control()
        self._begin(_HEAD, received=False)

    def flow_control(self) -> PauseTimingFlowControl:
        """This connection's flow control, made once it has a transport."""
        return PauseTimingFlowControl(self.transport, self.loop)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    # Where each wait begins and ends; the parser's callbacks run inside data_received. A
    # request begun in the read that ended the one before waits for the next read (or for
    # uvicorn's keep-alive timeout after that one's response).
    def data_received(self, data: bytes) -> None:
        if self._reading == _NOTHING:
            self._begin(_HEAD, received=True)
        self._received = True
        super().data_received(data)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._body_bytes = 0
        self._begin(_BODY, received=True)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._reading = _NOTHING
        super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:
        """The connection now belongs to a WebSocket protocol: this one stops timing it."""
        self._reading = _NOTHING
        self._stop_timer()
        super().handle_websocket_upgrade()

    def shutdown(self) -> None:
        """A request whose body has not all arrived is not accepted yet: it has
        SHUTDOWN_BODY_GRACE_SECONDS to finish arriving, then is refused, rather than holding
        the drain until the client finishes or the graceful timeout ends."""
        super().shutdown()  # idle: closed; serving a request: closed after its response
        if self._reading == _BODY and not self.transport.is_closing():
            self._refuse_body_at = self.loop.time() + SHUTDOWN_BODY_GRACE_SECONDS
            self._arm_by(self._refuse_body_at)

    # The one timer.
    def _begin(self, reading: int, received: bool) -> None:
        """Start the client's clock for what it must send next (runs twice a request)."""
        now = self.loop.time()
        flow = self._flow
        self._reading = reading
        self._received = received
        self._started = now
        self._paused_before = flow.paused_seconds(now) if flow.read_paused else flow.paused_total
        limits = self.read_timeouts
        when = now + (limits.header_seconds if reading == _HEAD else limits.body_seconds)
        self._arm_by(when)

    def _arm_by(self, when: float) -> None:
        """Make the timer fire no later than ``when``."""
        if self._timer is None or self._timer_at > when:
            self._arm(when)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(when, self._on_timer)
        self._timer_at = when

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer, fired_at = None, self._timer_at
        if self._reading == _NOTHING or self.transport.is_closing():
            return
        refuse_at = self._refuse_body_at
        if refuse_at is not None and self._reading == _BODY:
            if self.loop.time() >= refuse_at:
                self._refuse_at_shutdown()
                return
            self._arm(refuse_at)  # the client's own deadline is judged below, if sooner
        if self._held_by_server():
            self._begin(self._reading, self._received)  # the client's time starts again
            return
        now = self.loop.time()
        if now - fired_at > STALL_SECONDS:
            self._arm_by(now)  # read what arrived during the stall (I/O runs first), then judge
            return
        deadline = self._deadline(now)
        if now < deadline:
            self._arm_by(deadline)
        elif self._reading == _HEAD:
            self._head_too_slow()
        else:
            self._body_too_slow()

    def _held_by_server(self) -> bool:
        """Whether the client is waiting on the server rather than the other way round: an
        earlier response still owed before a pipelined head, or ``100 Continue`` unsent."""
        cycle = self.cycle
        if cycle is None:
            return False
        if self._reading == _HEAD:
            return not cycle.response_complete
        return cycle.waiting_for_100_continue

    def _deadline(self, now: float) -> float:
        limits = self.read_timeouts
        paused = self._flow.paused_seconds(now) - self._paused_before
        if self._reading == _HEAD:
            return self._started + limits.header_seconds + paused
        earned = self._body_bytes / limits.body_min_rate
        return self._started + limits.body_seconds + earned + paused

    def _head_too_slow(self) -> None:
        if not self._received:  # nothing to answer: a silent connection is just closed
            self.refuse(Reason.HEADER_TIMEOUT, None, "")
            return
        seconds = self.read_timeouts.header_seconds
        self.refuse(Reason.HEADER_TIMEOUT, 408,
                    f"request line and headers not received within {seconds:g} s")  # fmt: skip

    def _refuse_at_shutdown(self) -> None:
        answered = self.cycle is not None and self.cycle.response_started  # answered early
        self.refuse(Reason.UNAVAILABLE, None if answered else 503, SHUTTING_DOWN)

    def _body_too_slow(self) -> None:
        limits = self.read_timeouts
        message = (f"request body not received in time ({limits.body_seconds:g} s, plus "
                   f"1 s per {limits.body_min_rate:g} bytes received)")  # fmt: skip
        answered = self.cycle is not None and self.cycle.response_started  # answered early
        self.refuse(Reason.BODY_TIMEOUT, None if answered else 408, message)
