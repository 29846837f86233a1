"""The heart-beat timer of one connection: a beat to the peer when one is due, and the connection
closed when the peer's beats are late.

The STOMP state machine knows the negotiated intervals and when data last went each way; this
object only sets a timer for its next deadline. The peer is not held to its interval while the
broker is not reading it (flow control), nor for a moment after reading resumes: its beats were
waiting in our socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sluice.server.flow import FlowControl
from sluice.server.outbound import Outbound
from sluice.stomp.connection import StompConnection

__all__ = ["READ_GRACE_S", "Heartbeat"]

# After reading resumes, the peer's beats already in our socket have this long to be read.
READ_GRACE_S = 1.0


class Heartbeat:
    """Keeps one timer at the connection's next heart-beat deadline."""

    __slots__ = (
        "_closing",
        "_flow",
        "_loop",
        "_outbound",
        "_resumed_at",
        "_stomp",
        "_timed_out",
        "_timer",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        stomp: StompConnection,
        flow: FlowControl,
        outbound: Outbound,
        *,
        timed_out: Callable[[], None],
        closing: Callable[[], bool],
    ) -> None:
        self._loop = loop
        self._stomp = stomp
        self._flow = flow
        self._outbound = outbound
        # The peer's beats are late: close the connection.
        self._timed_out = timed_out
        self._closing = closing
        self._timer: asyncio.TimerHandle | None = None
        self._resumed_at = float("-inf")

    def arm(self) -> None:
        """Set the timer for the next deadline (after CONNECTED, and after each one)."""
        self.cancel()
        if self._closing():
            return
        deadline = self._stomp.next_deadline(self._loop.time())
        if deadline is not None:
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def cancel(self) -> None:
        """Stop the timer (the connection closes)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def reading_resumed(self, now: float) -> None:
        """The broker reads the peer again: give its waiting beats `READ_GRACE_S`."""
        self._resumed_at = now

    def _on_timer(self) -> None:
        self._timer = None
        stomp = self._stomp
        now = self._loop.time()
        held = self._flow.reading_paused or now - self._resumed_at < READ_GRACE_S
        if held:
            # We stopped reading this peer (flow control): its heart-beats wait in our socket.
            stomp.peer_held(now)
        if stomp.peer_timed_out(now):
            self._timed_out()
            return
        if stomp.heartbeat_due(now):
            outbound = self._outbound
            if not outbound.chunks:
                outbound.write(stomp.heartbeat())
            outbound.flush()
        self.arm()
