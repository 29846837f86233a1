"""A pending journal operation, as the store queues it and the writer writes it."""

from __future__ import annotations

from sluice.store.api import WriteHandle
from sluice.store.journal import format as fmt
from sluice.store.journal.overlay import Cleanup


class Op:
    """One pending record (or, with `rtype` 0, only a handle to complete)."""

    __slots__ = (
        "cleanup",
        "handle",
        "lazy",
        "location",
        "nbytes",
        "parts",
        "record",
        "replaced",
        "rtype",
    )

    def __init__(
        self,
        rtype: int,
        record: fmt.Record | None,
        parts: list[bytes] | None,
        handle: WriteHandle | None,
        cleanup: Cleanup | None = None,
    ) -> None:
        self.rtype = rtype
        self.record = record
        self.parts = parts
        self.nbytes = sum(map(len, parts)) if parts else 0
        self.handle = handle
        self.location: tuple[int, int, int] | None = None
        self.cleanup = cleanup
        # A remove's: the overlay entry it hid (an add the index has not committed yet), put
        # back if the remove is never written.
        self.replaced: Op | None = None
        # Nobody waits for this record to be durable (an acknowledgement without a receipt, a
        # cursor move): a batch of lazy ops alone is written but not synced; the next sync
        # covers it (see `writer.py`).
        self.lazy = False

    def take_cleanup(self) -> Cleanup | None:
        """The overlay cleanup, which the op then lets go of. An add's cleanup names the op
        itself (the overlay entry to drop): kept on the op, the two would form a reference
        cycle per message, which only the cyclic garbage collector frees."""
        cleanup, self.cleanup = self.cleanup, None
        return cleanup

    @classmethod
    def of(cls, record: fmt.Record, handle: WriteHandle | None = None) -> Op:
        """An op for any record but ADD."""
        rtype, payload = fmt.encode(record)
        return cls(rtype, record, [payload], handle)
