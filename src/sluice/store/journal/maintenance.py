"""Checkpoints, collection and retiring data files, run by the writer thread between batches.

`Maintenance` commits the index (a checkpoint) every `index_write_batch` records or
`checkpoint_interval_s`, always after the journal is synced up to the checkpoint position, so the
index never gets ahead of durable journal data; first it writes the DEST_SEQ records of sequences
that cancelled adds used. Every `gc_interval_s` (or on request) it collects: `gc.py` decides
which files may go and what compaction copies, this module carries the plan out (copies written
and synced through the `Appender`, a FILES_RETIRED record, then the files deleted or archived).

An index commit that finds no room is not a failure: LMDB keeps the last commit, the records
since are taken into a new transaction (`redo.py`), the store counts as full (`index_no_space`),
and the checkpoint is tried again every `INDEX_RETRY_S`; collection waits for it. A round that
finds no room, or a damaged record while compacting, stops only that round; any other I/O error
fails the store, through the writer's `fail`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sluice.config import StoreConfig
from sluice.errors import CorruptionError, DiskFullError, StoreError
from sluice.store.api import Fence, StoreStats
from sluice.store.journal import format as fmt
from sluice.store.journal import gc
from sluice.store.journal.appender import Appender
from sluice.store.journal.files import FileReader, file_path, fsync_dir
from sluice.store.journal.gc import GcResult
from sluice.store.journal.ops import Op
from sluice.store.journal.overlay import Overlay
from sluice.store.journal.redo import redo_since_commit
from sluice.store.journal.state import JournalState

log = logging.getLogger(__name__)

# An index checkpoint the disk had no room for is tried again after this long.
INDEX_RETRY_S = 1.0


class Maintenance:
    """The writer thread's checkpoints and collections, and when they are due."""

    def __init__(
        self,
        *,
        config: StoreConfig,
        durable: bool,
        state: JournalState,
        appender: Appender,
        lock: threading.Lock,
        overlay: Overlay,
        stats: StoreStats,
        read_lock: threading.Lock,
        store_reader: FileReader,
        journal_dir: Path,
        archive_dir: Path,
        fail: Callable[[BaseException], None],
        fence: Fence | None = None,
    ) -> None:
        self._config = config
        self._fence = fence
        self._durable = durable
        self._state = state
        self._appender = appender
        self._head = appender.head
        self._lock = lock
        self._overlay = overlay
        self._stats = stats
        self._read_lock = read_lock
        # The store's descriptors, which readers use: a retired file's is closed too.
        self._store_reader = store_reader
        # This thread's own, for compaction's reads.
        self._reader = FileReader(journal_dir)
        self._journal_dir = journal_dir
        self._archive_dir = archive_dir
        self._fail = fail
        now = time.monotonic()
        self._last_checkpoint = now
        self._last_gc = now
        head = self._head
        self._cp_position = (head.file_no, head.offset)
        # The last index commit found no room on the disk: the store counts as full until a
        # commit goes through (tried again every INDEX_RETRY_S).
        self.index_no_space = False
        self._index_retry_at = 0.0
        self._index_full_since = 0.0

    def close(self) -> None:
        """Close this thread's read descriptors."""
        self._reader.close()

    # -- timers ------------------------------------------------------------------------------------

    def next_due(self, *, cursors_waiting: bool) -> float:
        """When (monotonic) the next collection or checkpoint is due; `cursors_waiting`: cursor
        moves wait for a batch or a checkpoint to write them."""
        due = self._last_gc + self._config.gc_interval_s
        if self._state.updates or cursors_waiting:
            due = min(due, self._last_checkpoint + self._config.checkpoint_interval_s)
        if self.index_no_space:
            # Neither a checkpoint nor collection (which starts with one) before the retry.
            due = self._index_retry_at
        return due

    def run_due(self, now: float) -> None:
        """Checkpoint and collect if their time has come (the store has not failed)."""
        cfg = self._config
        if self.index_no_space:
            due = now >= self._index_retry_at
        else:
            due = bool(self._state.updates) and (
                self._state.updates >= cfg.index_write_batch
                or now - self._last_checkpoint >= cfg.checkpoint_interval_s
            )
        if due:
            try:
                self.checkpoint()
            except DiskFullError as exc:
                # Nothing was written, or the index was brought back (`_index_no_room`); the
                # next turn tries again.
                self._last_checkpoint = now
                if not self.index_no_space:
                    log.warning("journal checkpoint put off: %s", exc)
            except (OSError, StoreError) as exc:
                self.round_failed("checkpoint", exc)
                return
        if self.index_no_space:
            return  # collection starts with a checkpoint: it waits for the retry
        if now - self._last_gc >= cfg.gc_interval_s:
            self._last_gc = now
            try:
                self.collect()
            except (OSError, StoreError) as exc:
                self.round_failed("garbage collection", exc)

    def round_failed(self, what: str, exc: OSError | StoreError) -> None:
        """A checkpoint or collection failed. Lack of room (nothing was written) or a damaged
        record met while compacting stops only that round; any other I/O error (a failed sync,
        a write cut short) fails the store: a sync that failed is never tried again as if the
        data before it were safe."""
        if isinstance(exc, DiskFullError | CorruptionError):
            if not (self.index_no_space and isinstance(exc, DiskFullError)):
                log.error("%s stopped: %s", what, exc)  # else said once for the episode
            return
        log.error("%s failed; the store stops accepting writes: %s", what, exc)
        self._fail(exc)

    # -- checkpoints -------------------------------------------------------------------------------

    def checkpoint(self, *, write_marker: bool = True) -> None:
        """Commit the index with the journal complete (and synced) up to the head position."""
        head = self._head
        state = self._state
        seq_records = state.take_cancelled_seqs()
        seq_ops = [Op.of(record) for record in seq_records]
        held: list[fmt.DestSeq] = []
        if seq_ops:
            try:
                self._appender.write(seq_ops)
            except DiskFullError as exc:
                # Nothing was written; the index commit below holds them until there is room
                # (a close on a full disk must not let them be handed out again).
                log.info("journal: last sequences held in the index for now: %s", exc)
                state.hold_seqs(seq_records)
                held = seq_records
            else:
                self._appender.apply(seq_ops)
        position = (head.file_no, head.offset)
        if position == self._cp_position and not state.dirty:
            return
        if self._durable and head.unsynced:
            self._appender.sync()
        state.file_seen(head.file_no, head.offset)
        state.flush(position)
        try:
            state.index.commit(reopen=True)
        except DiskFullError as exc:
            self._index_no_room(exc, position)
            # The state came back from the last commit and the journal: sequences held only
            # in the lost transaction are noted again for the next checkpoint.
            for record in held:
                state.note_cancelled(record.destination, record.seq)
            raise
        if self.index_no_space:
            self.index_no_space = False
            log.info(
                "journal: index checkpoint taken again after %.1f s without room",
                time.monotonic() - self._index_full_since,
            )
        cleanups = self._appender.take_cleanups()
        with self._lock:
            self._overlay.drop(cleanups)
            self._stats.checkpoints += 1
            self._stats.last_checkpoint_ms = int(time.time() * 1000)
        self._last_checkpoint = time.monotonic()
        if write_marker:
            # Informational (dump and audits); it sits at the checkpoint position, so replay
            # reads it and nothing depends on it being durable (nor on it being there at all,
            # when the disk had no room for it).
            marker = Op.of(fmt.Checkpoint(position[0], position[1], int(time.time() * 1000)))
            with contextlib.suppress(DiskFullError):
                self._appender.write([marker])
        self._cp_position = (head.file_no, head.offset)

    def closing_checkpoint(self) -> None:
        """The last checkpoint, as the writer stops (no marker). A disk without room for it is
        not an error: the next start replays the journal from the checkpoint before."""
        try:
            self.checkpoint(write_marker=False)
        except DiskFullError as exc:
            log.warning(
                "journal: last checkpoint not taken (%s); the next start replays "
                "the journal from the one before",
                exc,
            )

    def _index_no_room(self, exc: DiskFullError, position: tuple[int, int]) -> None:
        """The index commit found no room and LMDB dropped its transaction; the index on disk
        is as the last checkpoint left it. Take the journal's records since then into a new
        transaction and count the store as full until a commit goes through. Readers see no
        change: they read the last commit and the overlay, whose cleanups wait for a commit."""
        redo_since_commit(self._state, self._journal_dir, position)
        now = time.monotonic()
        self._index_retry_at = now + INDEX_RETRY_S
        if not self.index_no_space:
            self.index_no_space = True
            self._index_full_since = now
            log.warning(
                "journal: index checkpoint put off: %s; the journal keeps what the index has "
                "not taken yet, and the store counts as full until a checkpoint goes through",
                exc,
            )

    # -- collection --------------------------------------------------------------------------------

    def collect(self, *, compact: bool = True) -> GcResult:
        """Checkpoint, delete or archive what nothing needs, compact what is worth it, and
        delete what compaction freed. Deleting comes first, so a disk too full for the copies
        still gets the space back; compaction that finds no room is put off to the next round."""
        result = GcResult()
        state = self._state
        self.checkpoint()
        self._retire_unneeded(result)
        if compact:
            targets = gc.compaction_targets(
                state, self._head.file_no, self._config.compaction_live_ratio
            )
            if targets:
                ops = gc.copy_ops(state, self._reader, self._journal_dir, targets, result)
                try:
                    self._appender.write_durable(ops)
                except DiskFullError as exc:
                    log.warning("journal compaction put off: %s", exc)
                else:
                    self.checkpoint()
                    result.compacted = targets
                    result.moved_messages = sum(1 for op in ops if op.rtype == fmt.RecordType.ADD)
                    with self._lock:
                        self._stats.compacted_files += len(targets)
                        self._stats.damaged_records += result.damaged_records
                        self._stats.last_compaction_ms = int(time.time() * 1000)
                    self._retire_unneeded(result)
        for line in result.lines():
            log.info("journal gc: %s", line)
        with self._lock:
            self._stats.last_gc_ms = int(time.time() * 1000)
        return result

    def _retire_unneeded(self, result: GcResult) -> None:
        retire = gc.deletable(self._state, self._head.file_no)
        if not retire:
            return
        archive = self._config.archive and self._durable
        self.retire_files(retire, archive)
        (result.archived if archive else result.deleted).extend(retire)
        self.checkpoint()

    def retire_files(self, file_nos: Sequence[int], archive: bool) -> None:
        """Delete data files, or move them to the archive, once nothing needs them: first the
        FILES_RETIRED record that names them (synced), then the files."""
        if not file_nos:
            return
        record = gc.retired_after(self._state, list(file_nos), self._head.file_no)
        self._appender.write_durable([Op.of(record)])
        gone: list[int] = []
        try:
            if archive:
                self._archive_dir.mkdir(parents=True, exist_ok=True)
            for file_no in file_nos:
                self._retire_file(file_no, archive)
                gone.append(file_no)
            fsync_dir(self._journal_dir)
            if archive:
                fsync_dir(self._archive_dir)
        finally:
            # What left the directory is gone whatever failed after it (a crash before the
            # directory sync may bring a file back: nothing in it is needed, the next
            # collection removes it again).
            self._state.files_gone(gone)
            with self._lock:
                self._stats.files -= len(gone)
                self._stats.disk_bytes -= len(gone) * self._head.file_bytes
                if archive:
                    self._stats.gc_archived_files += len(gone)
                else:
                    self._stats.gc_deleted_files += len(gone)

    def _retire_file(self, file_no: int, archive: bool) -> None:
        if self._fence is not None:
            # Checked at each file: a master that lost its lease deletes and moves nothing.
            self._fence.check()
        path = file_path(self._journal_dir, file_no)
        data_bytes = self._state.files[file_no].data_bytes
        self._reader.forget(file_no)
        with self._read_lock:
            self._store_reader.forget(file_no)
            if not archive:
                path.unlink(missing_ok=True)
                return
            target = self._archive_dir / path.name
            if not path.exists() and target.exists():
                return  # moved by an earlier collection that failed after the move
            if data_bytes:
                os.truncate(path, data_bytes)
            os.replace(path, target)
