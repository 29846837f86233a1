"""Helpers for the server tests: a look at the sessions from the broker's own loop."""

from __future__ import annotations

from dataclasses import dataclass

from conftest import RunningBroker
from sluice.server.flow import ReadPause


@dataclass(frozen=True)
class SessionView:
    """What a test may know of one session, read on the broker's loop."""

    outbound_bytes: int
    reasons: frozenset[ReadPause]
    pending_receipts: int
    writable: bool
    subscriptions: int


def sessions(broker: RunningBroker) -> list[SessionView]:
    """Every connected session, as seen now from the broker's loop."""

    def look() -> list[SessionView]:
        return [
            SessionView(
                s.outbound_bytes,
                s.flow.reasons,
                s.pending_receipts,
                s.flow.writable,
                len(s.core.subs),
            )
            for s in broker.server.sessions
            if s.core is not None
        ]

    return broker.call(look)  # type: ignore[no-any-return]
