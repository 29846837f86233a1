"""The receipts of one connection, kept in the order of the frames that asked for them.

A receipt waits for its frame's work (a persistent SEND's write, a receipted ACK's removal, a
COMMIT) and for every receipt before it, so a receipt never overtakes an earlier one and
DISCONNECT's receipt means everything before it is done. The queue is bounded by
`max_pending_receipts_per_connection`: when it is full the connection is not read
(`ReadPause.RECEIPTS`) until it has drained to half, as a producer is held back rather than
refused while the store catches up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from sluice.errors import DiskFullError, StoreIOError
from sluice.server.flow import FlowControl, ReadPause
from sluice.stomp.encoding import escape_value
from sluice.stomp.frames import Version


class PendingReceipt:
    """A receipt waiting its turn: sent once `done` and every receipt before it is sent."""

    __slots__ = ("closes", "done", "error", "extra_headers", "receipt_id")

    def __init__(
        self,
        receipt_id: str | None,
        *,
        done: bool,
        extra_headers: str = "",
        closes: bool = False,
        error: str | None = None,
    ) -> None:
        # None: the frame asked for no receipt, but later receipts still wait for its work.
        self.receipt_id = receipt_id
        self.done = done
        self.extra_headers = extra_headers
        # DISCONNECT: close the connection once this receipt is out.
        self.closes = closes
        # A refused frame: once the receipts before it are out, an ERROR with this message
        # (and `receipt-id`), then the connection closes.
        self.error = error


class ReceiptQueue:
    """Receipts in frame order, at most `limit` of them; reading pauses while it is full."""

    __slots__ = ("_count", "_entries", "_flow", "_resume_at", "limit")

    def __init__(self, limit: int, flow: FlowControl, count: Callable[[str], None]) -> None:
        self.limit = limit
        self._resume_at = limit // 2
        self._flow = flow
        self._count = count
        self._entries: deque[PendingReceipt] = deque()

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def add(
        self,
        receipt_id: str | None,
        *,
        done: bool,
        extra_headers: str = "",
        closes: bool = False,
        error: str | None = None,
    ) -> PendingReceipt:
        """Queue a receipt behind the others. The caller reads no further frame once this fills
        the queue: one frame adds at most one entry, so the queue never holds more than `limit`."""
        entry = PendingReceipt(
            receipt_id, done=done, extra_headers=extra_headers, closes=closes, error=error
        )
        entries = self._entries
        entries.append(entry)
        if len(entries) >= self.limit and ReadPause.RECEIPTS not in self._flow.reasons_held:
            self._count("flow_paused_receipts")
            self._flow.pause(ReadPause.RECEIPTS)
        return entry

    def pop_done(self) -> list[PendingReceipt]:
        """Take the receipts that may go out now, in order; resume reading once at half."""
        entries = self._entries
        ready: list[PendingReceipt] = []
        while entries and entries[0].done:
            ready.append(entries.popleft())
        if len(entries) <= self._resume_at:
            self._flow.resume(ReadPause.RECEIPTS)
        return ready


def receipt_frame(receipt_id: str, extra_headers: str, version: Version) -> bytes:
    """A RECEIPT frame; `extra_headers` are complete header lines, already escaped."""
    if version is not Version.V1_0:
        receipt_id = escape_value(receipt_id, version)
    return (
        b"RECEIPT\nreceipt-id:" + receipt_id.encode() + b"\n" + extra_headers.encode() + b"\n\x00"
    )


def not_stored_message(error: BaseException) -> str:
    """The ERROR message for a send the store did not write, naming the cause when the store gave
    one fit for a client (never the text of an unexpected exception)."""
    if isinstance(error, DiskFullError):
        return (
            f"the message was not stored: the store's disk is full ({error.strerror}); "
            "send it again later"
        )
    if isinstance(error, StoreIOError):
        return f"the message was not stored: the message store failed ({error.reason}); " + _LOG
    return "the message was not stored: the message store failed; " + _LOG


def not_committed_message(cause: str | None) -> str:
    """The ERROR message for a COMMIT the store did not write (`cause` as the broker has it)."""
    detail = f" ({cause})" if cause else ""
    return f"the transaction was not committed: the message store failed{detail}; " + _LOG


_LOG = "see the broker log"
