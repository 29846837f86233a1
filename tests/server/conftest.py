"""Helpers for the server tests: a store whose completions the test releases, a look at the
sessions from the broker's own loop, and a poll for counters nothing can be awaited on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conftest import RunningBroker
from sluice.server.flow import ReadPause
from sluice.store.api import CompletionSink, Recovery, WriteHandle
from sluice.store.memory import MemoryStore


class HeldStore(MemoryStore):
    """The memory store, except that while `holding` its completions wait for `release()`:
    receipts that wait on the store stay pending as long as the test wants."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = False
        self._held: list[WriteHandle] = []
        self._deliver: CompletionSink | None = None

    def open(self, sink: CompletionSink) -> Recovery:
        self._deliver = sink
        return super().open(self._complete_or_hold)

    def _complete_or_hold(self, handles: Sequence[WriteHandle]) -> None:
        if self.holding:
            self._held.extend(handles)
        else:
            assert self._deliver is not None
            self._deliver(handles)

    def release(self) -> None:
        """Stop holding and complete what was held (call on the broker's loop)."""
        self.holding = False
        held, self._held = self._held, []
        assert self._deliver is not None
        self._deliver(held)


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
