"""Putting records at the head of the journal and their effect into the index's view.

`Appender` is the writer thread's hands on the journal: it places ops' records at the head file
(rolling over to the next data file as needed), syncs it, and applies the written records to the
`JournalState`. The writer uses it for batches, and `maintenance.Maintenance` for checkpoints,
compaction copies and FILES_RETIRED records. What an applied op leaves in the overlay waits here
(`take_cleanups`) until an index commit holds its effect.

Used on the writer thread only; the store lock is taken for what other threads see (op locations,
stats), never across a write or a sync.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from sluice.errors import DiskFullError, StoreError
from sluice.store.api import BatchTimes, StoreStats
from sluice.store.journal import format as fmt
from sluice.store.journal.files import HeadFile
from sluice.store.journal.ops import Op
from sluice.store.journal.overlay import Cleanup
from sluice.store.journal.state import JournalState


class Appender:
    """Writes, syncs and applies ops for the writer thread."""

    def __init__(
        self,
        *,
        head: HeadFile,
        state: JournalState,
        lock: threading.Lock,
        stats: StoreStats,
        durable: bool,
    ) -> None:
        self.head = head
        self.state = state
        self.durable = durable
        self._lock = lock
        self._stats = stats
        # When the head was last synced (monotonic), for the PERIODIC policy's timer.
        self.last_sync_s = time.monotonic()
        self._cleanups: list[Cleanup] = []

    def write(self, ops: Sequence[Op], times: BatchTimes | None = None) -> None:
        """Append the ops' records, rolling over as needed; sets each op's location. With
        `times`, stamps when the records are framed and writing begins.

        Where the records go is worked out first; when they need the next data file, it is
        prepared before anything is written, so `DiskFullError` means nothing was written. A
        failure after the first byte raises `StoreError` (the store must then fail).

        Locations are set once every record is in its file: until then readers take a record
        from its op's parts (a location set earlier would send them to bytes not yet written)."""
        head = self.head
        segments: list[list[bytes]] = [[]]
        placed: list[tuple[Op, tuple[int, int, int]]] = []
        file_no, pos = head.file_no, head.offset
        for op in ops:
            assert op.parts is not None
            header, length = fmt.frame(op.rtype, op.parts)
            if pos + length > head.file_bytes and pos > fmt.FILE_HEADER_RECORD_BYTES:
                segments.append([])
                file_no += 1
                pos = fmt.FILE_HEADER_RECORD_BYTES
            placed.append((op, (file_no, pos, length)))
            segments[-1].append(header)
            segments[-1].extend(op.parts)
            pos += length
        if times is not None:
            times.write_ns = time.perf_counter_ns()
        if len(segments) > 1:
            head.prepare_next()
        written = False
        for i, buffers in enumerate(segments):
            if i:
                self.state.file_seen(head.file_no, head.offset)
                try:
                    head.rollover()
                except DiskFullError as exc:
                    if not written:
                        raise
                    raise StoreError(f"journal rollover failed mid-batch: {exc}") from exc
                self.state.file_seen(head.file_no, head.offset)
                with self._lock:
                    self._stats.files += 1
                    self._stats.disk_bytes += head.file_bytes
            if buffers:
                written = True
                head.write(buffers)
        with self._lock:
            for op, location in placed:
                op.location = location
            self._note_syncs()

    def sync(self) -> None:
        """Sync the head file."""
        self.head.sync()
        self.last_sync_s = time.monotonic()
        with self._lock:
            self._note_syncs()

    def _note_syncs(self) -> None:
        """Copy the head's sync counts where other threads read them (the lock held)."""
        head, stats = self.head, self._stats
        if stats.syncs != head.syncs:
            stats.syncs = head.syncs
            stats.sync_bucket_counts = tuple(head.sync_counts)
            stats.sync_seconds_total = head.sync_ns / 1e9

    def apply(self, ops: Sequence[Op]) -> None:
        """Apply written ops to the state; their overlay cleanups wait for the next commit."""
        apply = self.state.apply
        for op in ops:
            assert op.location is not None
            assert op.record is not None
            apply(op.rtype, op.record, *op.location)
            cleanup = op.take_cleanup()
            if cleanup is not None:
                self._cleanups.append(cleanup)

    def write_durable(self, ops: Sequence[Op]) -> None:
        """Write, sync and apply internal ops (compaction copies, FILES_RETIRED records)."""
        self.write(ops)
        if self.durable:
            self.sync()
        self.apply(ops)
        with self._lock:
            self._stats.written_records += len(ops)

    def take_cleanups(self) -> list[Cleanup]:
        """The overlay cleanups of every op applied since the last call (an index commit now
        holds their effect)."""
        cleanups, self._cleanups = self._cleanups, []
        return cleanups
