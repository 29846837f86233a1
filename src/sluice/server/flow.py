"""One flow-control object per connection: every pause and resume of reading goes through it.

Reading stops while any reason holds (a destination over its memory limit, too many pending store
writes, too many receipts waiting, disk full, our replies to the peer piling up unread) and resumes
only when none does. Writing has its own state, fed by the transport's high/low water marks: above
the high mark the connection is not dispatched to, and it is not read either (`OUTBOUND`), so a peer
that does not read cannot make the broker buffer replies for it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class ReadPause(enum.Enum):
    """Why a connection is not being read."""

    MEMORY = "memory"
    PENDING_WRITES = "pending_writes"
    DISK = "disk"
    RECEIPTS = "receipts"
    # The transport's write buffer is above its high-water mark: the peer is not reading.
    OUTBOUND = "outbound"
    # CONNECT's credentials are being checked (or a refused login waits out its delay).
    LOGIN = "login"
    CLOSING = "closing"


class FlowControl:
    """Tracks why reading is paused and whether the peer is keeping up with our writes."""

    __slots__ = ("_pause", "_reasons", "_resume", "paused_writing_since", "writable")

    @property
    def reasons_held(self) -> set[ReadPause]:
        """The live set of reasons (empty while reading): for loops that test it per frame."""
        return self._reasons

    def __init__(self, pause_reading: Callable[[], None], resume_reading: Callable[[], None]):
        self._pause = pause_reading
        self._resume = resume_reading
        self._reasons: set[ReadPause] = set()
        self.writable = True
        self.paused_writing_since: float | None = None

    @property
    def reading_paused(self) -> bool:
        """True while any reason to stop reading holds."""
        return bool(self._reasons)

    @property
    def reasons(self) -> frozenset[ReadPause]:
        """The reasons that currently hold."""
        return frozenset(self._reasons)

    def pause(self, reason: ReadPause) -> None:
        """Stop reading for `reason` (idempotent)."""
        if reason in self._reasons:
            return
        first = not self._reasons
        self._reasons.add(reason)
        if first:
            self._pause()

    def resume(self, reason: ReadPause) -> bool:
        """Drop `reason`; resume reading if no other holds. Returns True if reading resumed."""
        if reason not in self._reasons:
            return False
        self._reasons.discard(reason)
        if not self._reasons:
            self._resume()
            return True
        return False

    def writing_paused(self, now: float) -> None:
        """The transport's buffer went above its high-water mark: stop dispatching and reading."""
        self.writable = False
        self.paused_writing_since = now
        self.pause(ReadPause.OUTBOUND)

    def writing_resumed(self) -> None:
        """The transport's buffer drained below its low-water mark: dispatch and read again."""
        self.writable = True
        self.paused_writing_since = None
        self.resume(ReadPause.OUTBOUND)
