"""One dispatch pass of a queue: its limits, the verdict it reaches for each pending message, what
it has decided so far, and the dispatch marks.

Dispatch marks: before a message is handed to a consumer, the store must know that messages up to
its sequence may have been delivered, so that after a crash they come back marked redelivered. The
queue asks for marks ahead of dispatch, `MARK_STEP` sequences at a time, and dispatches only up to
the last mark the store has confirmed (`DispatchMarks`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluice.core.message import Message

if TYPE_CHECKING:
    from sluice.core.subscription import Subscription
    from sluice.store.api import MessageStore, WriteHandle

# Messages one dispatch pass looks at, and delivers, before it yields the loop.
SCAN_LIMIT = 4096
DELIVER_LIMIT = 2048
# Dispatch marks are written this many sequences ahead of dispatch.
MARK_STEP = 1000
# Without a store that survives restarts there is nothing to mark.
_NO_MARKS = 1 << 62


class Verdict(enum.Enum):
    """What one dispatch pass does with one pending message."""

    DELIVER = "deliver"  # to the subscription chosen
    EXPIRED = "expired"  # dead-lettered after the pass
    DISCARD = "discard"  # its stream's consumer died (stream_policy=discard): dead-lettered
    HOPELESS = "hopeless"  # nobody can take it before something else happens: first to evict
    SKIP = "skip"  # not now (no credit, no selector matches): evicted only as a last resort
    WAIT = "wait"  # stays pending, never evicted (not stored, or not yet marked dispatched)
    STOP = "stop"  # nothing after it may go in this pass


# The verdicts as module names: on Python 3.11 reading an enum member through its class costs
# several times a global read, and the dispatch pass reads them for every message.
DELIVER, EXPIRED, DISCARD = Verdict.DELIVER, Verdict.EXPIRED, Verdict.DISCARD
HOPELESS, SKIP, WAIT, STOP = Verdict.HOPELESS, Verdict.SKIP, Verdict.WAIT, Verdict.STOP


class DispatchMarks:
    """The store's dispatch marks for one queue (module docstring, "Dispatch marks"): which
    sequences may be delivered now, asking for the next mark before the current one runs out."""

    def __init__(self, store: MessageStore, name: str, wakeup: Callable[[], None], *, on: bool):
        self._store = store
        self._name = name
        self._wakeup = wakeup
        self.confirmed = 0 if on else _NO_MARKS
        self._requested = self.confirmed
        # Sequences up to here may go without a word to the store (`allows` is True for them and
        # asks for nothing): the dispatch pass checks this first and calls `allows` past it.
        self.clear_to = self.confirmed - MARK_STEP // 2

    def allows(self, seq: int) -> bool:
        """Whether `seq` may be delivered now; asks for marks as needed."""
        if seq > self.confirmed:
            if self._requested < seq:
                self._request(seq)
            return False
        if self._requested <= self.confirmed and seq > self.confirmed - MARK_STEP // 2:
            self._request(self.confirmed)  # ask for the next mark before this one runs out
        return True

    def _request(self, seq: int) -> None:
        target = seq + MARK_STEP
        self._requested = target

        def confirmed(handle: WriteHandle) -> None:
            if target > self.confirmed:
                self.confirmed = target
                self.clear_to = target - MARK_STEP // 2
            self._wakeup()

        # Completions run on the loop after this returns, so the callback is in place in time.
        self._store.mark_dispatched(self._name, target).on_complete = confirmed


@dataclass
class Pass:
    """What one dispatch pass has decided so far."""

    ready: list[Subscription]
    now_ms: int
    delivered: int = 0
    taken: list[int] = field(default_factory=list)
    expired: list[tuple[int, Message]] = field(default_factory=list)
    discarded: list[tuple[int, Message]] = field(default_factory=list)
    hopeless: list[tuple[int, Message]] = field(default_factory=list)
    skipped: list[tuple[int, Message]] = field(default_factory=list)
    # Groups whose next message waits for its consumer's credit.
    held: set[str] = field(default_factory=set)
