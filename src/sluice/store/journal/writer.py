"""The group-commit writer: one thread that drains the pending queue into the journal.

Each turn it takes everything pending (up to a batch bound) under the store lock, marking handles
TAKEN so they can no longer be cancelled; writes the batch with `pwritev` calls (one per file
touched, IOV_MAX buffers at a time); syncs once when the policy is ALWAYS; marks the handles
WRITTEN and hands them all to the completion sink in one call; then applies the records to the
index. The index is committed (a checkpoint) every `index_write_batch` records or
`checkpoint_interval_s`, always after the journal is synced up to the checkpoint position, so the
index never gets ahead of durable journal data. GC and compaction run on this thread too.

The event-loop thread never waits for this thread's I/O: the lock is only held for queue and
handle bookkeeping, never across a write, sync or index commit.

Failures. A batch that needs the next data file has that file prepared before any of its bytes is
written; when the disk has no room for it (`DiskFullError`), the batch's handles fail with that
error and the store goes on: nothing was written, and it takes writes again once space is back.
Any other failure to write or sync (EIO, a failed fsync, ENOSPC in the middle of a batch) fails
the store: its data is never taken as safe, every later write fails, and a restart recovers from
the journal. An index commit that finds no room is not a failure: LMDB keeps the last commit, the
records since are taken into a new transaction (`redo.py`), the store counts as full, and the
checkpoint is tried again every `INDEX_RETRY_S`; any other index commit error fails the store.
Every wait on this thread from another one is bounded, and ends when it stops.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sluice.config import StoreConfig, SyncPolicy
from sluice.errors import CorruptionError, DiskFullError, StoreError
from sluice.store.api import CompletionSink, StoreStats, WriteHandle, WriteState
from sluice.store.journal import format as fmt
from sluice.store.journal import gc
from sluice.store.journal.files import FileReader, HeadFile, file_path, fsync_dir
from sluice.store.journal.gc import GcResult
from sluice.store.journal.ops import Op
from sluice.store.journal.overlay import Cleanup, Overlay
from sluice.store.journal.redo import redo_since_commit
from sluice.store.journal.state import JournalState

log = logging.getLogger(__name__)

MAX_BATCH_OPS = 4096
MAX_BATCH_BYTES = 16 * 1024 * 1024
# How long another thread waits for the writer: to run a request, to park, to stop.
REQUEST_TIMEOUT_S = 300.0
PAUSE_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
# An index checkpoint the disk had no room for is tried again after this long.
INDEX_RETRY_S = 1.0


class RequestKind(enum.Enum):
    """What another thread asks the writer thread to run."""

    CHECKPOINT = "checkpoint"
    GC = "gc"


@dataclass
class _Request:
    kind: RequestKind
    done: threading.Event
    result: gc.GcResult | None = None
    error: BaseException | None = None


class Writer:
    """Owns the head file, the index write transaction and the journal state once started."""

    def __init__(
        self,
        *,
        config: StoreConfig,
        durable: bool,
        state: JournalState,
        head: HeadFile,
        lock: threading.Lock,
        cond: threading.Condition,
        overlay: Overlay,
        stats: StoreStats,
        sink: CompletionSink,
        read_lock: threading.Lock,
        store_reader: FileReader,
        journal_dir: Path,
        archive_dir: Path,
    ) -> None:
        self.config = config
        self.durable = durable
        self.state = state
        self.head = head
        self.lock = lock
        self.cond = cond
        self.overlay = overlay
        self.stats = stats
        self.sink = sink
        self.read_lock = read_lock
        self.store_reader = store_reader
        self.reader = FileReader(journal_dir)
        self.journal_dir = journal_dir
        self.archive_dir = archive_dir
        self.queue: deque[Op] = deque()
        self.cursors: dict[tuple[str, str], int] = {}
        self.failed: BaseException | None = None
        self._requests: list[_Request] = []
        self._cleanups: list[Cleanup] = []
        self._paused = False
        self._parked = False
        self._closing = False
        # The thread has ended: requests are refused, waits end.
        self._ended = False
        # A batch needs about one rollover at most, so it is never held up by two new files.
        self._max_batch_bytes = min(MAX_BATCH_BYTES, max(head.file_bytes // 2, 1))
        now = time.monotonic()
        self._last_checkpoint = now
        self._last_sync = now
        self._last_gc = now
        self._cp_position = (head.file_no, head.offset)
        # The last index commit found no room on the disk: the store counts as full until a
        # commit goes through (tried again every INDEX_RETRY_S).
        self.index_no_space = False
        self._index_retry_at = 0.0
        self._index_full_since = 0.0
        self._thread = threading.Thread(target=self._run, name="sluice-journal", daemon=True)

    # -- called by the store (holding `lock` where noted) ------------------------------------------

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def submit(self, op: Op) -> None:
        """Queue an op. The caller holds `lock`."""
        self.queue.append(op)
        self.stats.pending_writes += 1
        self.stats.pending_write_bytes += op.nbytes
        self.cond.notify()

    def request(
        self, kind: RequestKind, timeout_s: float = REQUEST_TIMEOUT_S
    ) -> gc.GcResult | None:
        """Run a checkpoint or GC on the writer thread and wait for it (not from the loop).
        Raises `StoreError` when the writer is stopping, stopped or failed, or does not answer
        within `timeout_s`."""
        req = _Request(kind, threading.Event())
        with self.cond:
            if self._closing or self._ended or not self._thread.is_alive():
                raise StoreError("the journal writer is not running")
            if self.failed is not None:
                raise StoreError("the journal store failed earlier") from self.failed
            self._requests.append(req)
            self.cond.notify()
        if not req.done.wait(timeout_s):
            with self.cond:
                if req in self._requests:
                    self._requests.remove(req)
            if not req.done.is_set():
                raise StoreError(f"the journal writer did not run a {kind.value} in {timeout_s} s")
        if req.error is not None:
            raise req.error
        return req.result

    def pause(self, timeout_s: float = PAUSE_TIMEOUT_S) -> None:
        """Hold the writer before its next batch; returns once it is parked (at once when it
        failed or ended: it writes nothing more). Raises `StoreError` after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            self._paused = True
            self.cond.notify_all()
            while not (self._parked or self._ended or self.failed is not None):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._paused = False
                    self.cond.notify_all()
                    raise StoreError(f"the journal writer did not pause within {timeout_s} s")
                self.cond.wait(remaining)

    def resume(self) -> None:
        """Let a paused writer go on."""
        with self.cond:
            self._paused = False
            self.cond.notify_all()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Drain the queue, checkpoint, and end the thread; False when it did not end within
        `timeout_s` (it is left behind: the next start replays the journal)."""
        with self.cond:
            self._closing = True
            self._paused = False
            self.cond.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("the journal writer did not stop within %.0f s; leaving it", timeout_s)
            return False
        return True

    # -- the thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.state.index.begin_write()
            self._loop()
        except BaseException as exc:  # the thread's boundary: fail loudly, never silently stop
            log.exception("journal writer failed")
            self._set_failed(exc)
            self._drain_failed()
        finally:
            self.state.index.abort()
            self.reader.close()
            with self.cond:
                self._ended = True
                requests, self._requests = self._requests, []
                self.cond.notify_all()
            for req in requests:
                req.error = StoreError("the journal writer stopped")
                req.done.set()

    def _loop(self) -> None:
        while True:
            with self.cond:
                while True:
                    if self._paused and not self._closing:
                        self._parked = True
                        self.cond.notify_all()
                        self.cond.wait()
                        continue
                    self._parked = False
                    if self.queue or self._requests or self._closing:
                        break
                    timeout = self._next_due() - time.monotonic()
                    if timeout <= 0:
                        break
                    self.cond.wait(timeout)
                batch = self._take()
                cursors, self.cursors = self.cursors, {}
                requests, self._requests = self._requests, []
                finishing = self._closing and not self.queue
            if batch or cursors:
                self._process(batch, cursors)
            self._timers()
            for req in requests:
                self._serve(req)
            if finishing:
                if self.failed is None:
                    try:
                        self.checkpoint(write_marker=False)
                    except DiskFullError as exc:
                        log.warning(
                            "journal: last checkpoint not taken (%s); the next start replays "
                            "the journal from the one before",
                            exc,
                        )
                return

    def _take(self) -> list[Op]:
        batch: list[Op] = []
        nbytes = 0
        queue = self.queue
        max_bytes = self._max_batch_bytes
        while queue and len(batch) < MAX_BATCH_OPS and (not batch or nbytes < max_bytes):
            op = queue.popleft()
            batch.append(op)
            nbytes += op.nbytes
            handle = op.handle
            if handle is not None and handle.state is WriteState.PENDING and op.rtype:
                handle.state = WriteState.TAKEN
        self.stats.pending_writes -= len(batch)
        self.stats.pending_write_bytes -= nbytes
        return batch

    def _next_due(self) -> float:
        due = self._last_gc + self.config.gc_interval_s
        if self.state.updates or self.cursors:
            due = min(due, self._last_checkpoint + self.config.checkpoint_interval_s)
        if self.index_no_space:
            # Neither a checkpoint nor collection (which starts with one) before the retry.
            due = self._index_retry_at
        if self.head.unsynced and self.config.sync is SyncPolicy.PERIODIC:
            due = min(due, self._last_sync + self.config.sync_interval_ms / 1000)
        return due

    def _timers(self) -> None:
        if self.failed is not None:
            return
        now = time.monotonic()
        cfg = self.config
        if (
            self.head.unsynced
            and cfg.sync is SyncPolicy.PERIODIC
            and now - self._last_sync >= cfg.sync_interval_ms / 1000
        ):
            self._sync()
        if self.index_no_space:
            due = now >= self._index_retry_at
        else:
            due = bool(self.state.updates) and (
                self.state.updates >= cfg.index_write_batch
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
                self._maintenance_failed("checkpoint", exc)
                return
        if self.index_no_space:
            return  # collection starts with a checkpoint: it waits for the retry
        if now - self._last_gc >= cfg.gc_interval_s:
            self._last_gc = now
            try:
                self.collect()
            except (OSError, StoreError) as exc:
                self._maintenance_failed("garbage collection", exc)

    def _serve(self, req: _Request) -> None:
        try:
            if self.failed is not None:
                raise StoreError("the journal store failed earlier") from self.failed
            if req.kind is RequestKind.GC:
                req.result = self.collect()
            else:
                self.checkpoint()
        except BaseException as exc:
            req.error = exc
            if isinstance(exc, OSError | StoreError) and self.failed is None:
                self._maintenance_failed(req.kind.value, exc)
        req.done.set()

    def _maintenance_failed(self, what: str, exc: OSError | StoreError) -> None:
        """A checkpoint or collection failed. Lack of room (nothing was written) or a damaged
        record met while compacting stops only that round; any other I/O error (a failed sync,
        a write cut short) fails the store: a sync that failed is never tried again as if the
        data before it were safe."""
        if isinstance(exc, DiskFullError | CorruptionError):
            if not (self.index_no_space and isinstance(exc, DiskFullError)):
                log.error("%s stopped: %s", what, exc)  # else said once for the episode
            return
        log.error("%s failed; the store stops accepting writes: %s", what, exc)
        self._set_failed(exc)

    # -- batches -----------------------------------------------------------------------------------

    def _process(self, batch: list[Op], cursors: dict[tuple[str, str], int]) -> None:
        handles: list[WriteHandle] = []
        ops: list[Op] = []
        for op in batch:
            handle = op.handle
            if handle is not None:
                handles.append(handle)
            if op.rtype and (handle is None or handle.state is WriteState.TAKEN):
                ops.append(op)
        for (client_id, name), seq in cursors.items():
            ops.append(Op.of(fmt.SubCursor(client_id, name, seq)))
        # Cancelled adds used their sequences whether this batch is written or refused (a
        # destination delete applied with the batch forgets them).
        for op in batch:
            record = op.record
            if (
                isinstance(record, fmt.AddMeta)
                and not record.txno
                and op.handle is not None
                and op.handle.state is WriteState.CANCELLED
            ):
                self.state.note_cancelled(record.destination, record.seq)
        if self.failed is not None:
            self._fail_ops(ops, handles, self.failed)
            return
        try:
            self.write(ops)
            if self.config.sync is SyncPolicy.ALWAYS and self.durable:
                self._sync()
        except DiskFullError as exc:
            if _refusable(ops):
                # Raised before anything of the batch was written, and every op's requester
                # learns of it: these writes fail, the store does not.
                self._refuse(ops, handles, exc)
                return
            log.error("journal: no space for records that cannot be refused: %s", exc)
            self._set_failed(exc)
            self._fail_ops(ops, handles, exc)
            return
        except (OSError, StoreError) as exc:
            log.error("journal write failed; the store stops accepting writes: %s", exc)
            self._set_failed(exc)
            self._fail_ops(ops, handles, exc)
            return
        with self.lock:
            for op in ops:
                op.parts = None
            for handle in handles:
                if handle.state is WriteState.TAKEN:
                    handle.state = WriteState.WRITTEN
            self.stats.written_records += len(ops)
            self.stats.batches += 1
        self._deliver(handles)
        self._apply(ops)

    def write(self, ops: Sequence[Op]) -> None:
        """Append the ops' records, rolling over as needed; sets each op's location.

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
                with self.lock:
                    self.stats.files += 1
                    self.stats.disk_bytes += head.file_bytes
            if buffers:
                written = True
                head.write(buffers)
        with self.lock:
            for op, location in placed:
                op.location = location
            self.stats.syncs = head.syncs

    def _sync(self) -> None:
        self.head.sync()
        self._last_sync = time.monotonic()
        with self.lock:
            self.stats.syncs = self.head.syncs

    def _apply(self, ops: Sequence[Op]) -> None:
        apply = self.state.apply
        for op in ops:
            assert op.location is not None
            assert op.record is not None
            apply(op.rtype, op.record, *op.location)
            if op.cleanup is not None:
                self._cleanups.append(op.cleanup)

    def write_durable(self, ops: Sequence[Op]) -> None:
        """Write, sync and apply internal ops (compaction copies, recovery aborts)."""
        self.write(ops)
        if self.durable:
            self._sync()
        self._apply(ops)
        with self.lock:
            self.stats.written_records += len(ops)

    def _deliver(self, handles: list[WriteHandle]) -> None:
        if not handles:
            return
        try:
            self.sink(handles)
        except Exception:  # the sink is the core's; its failure must not stop the journal
            log.exception("completion sink raised")

    def _refuse(self, ops: Sequence[Op], handles: list[WriteHandle], exc: DiskFullError) -> None:
        """Fail a batch that found no room, keeping the store; cursor moves go with a later one."""
        with self.lock:
            self.stats.no_space_errors += 1
            for op in ops:
                record = op.record
                if isinstance(record, fmt.SubCursor):
                    self.cursors.setdefault((record.client_id, record.name), record.cursor)
        log.warning("journal: %d writes refused: %s", len(ops), exc)
        self._fail_ops(ops, handles, exc)

    # -- failure -----------------------------------------------------------------------------------

    def _set_failed(self, exc: BaseException) -> None:
        if self.failed is None:
            self.failed = exc
            with self.lock:
                self.stats.write_errors += 1

    def _fail_ops(self, ops: Sequence[Op], handles: list[WriteHandle], exc: BaseException) -> None:
        error = exc if isinstance(exc, StoreError) else StoreError(f"journal write failed: {exc}")
        with self.lock:
            for handle in handles:
                if not handle.done:
                    handle.state = WriteState.FAILED
                    handle.error = error
            self.overlay.drop([op.cleanup for op in ops if op.cleanup is not None])
            for op in ops:
                # A remove that was not written hides its message no longer.
                replaced = op.replaced
                if (
                    replaced is not None
                    and replaced.handle is not None
                    and replaced.handle.state is WriteState.WRITTEN
                    and isinstance(op.record, fmt.Remove)
                ):
                    destination, seq = op.record.destination, op.record.seq
                    entries = self.overlay.entries.get(destination)
                    if entries is None or seq not in entries:
                        self.overlay.put(destination, seq, replaced)
        self._deliver(handles)

    def _drain_failed(self) -> None:
        assert self.failed is not None
        while True:
            with self.cond:
                batch = self._take()
                self.cursors.clear()
                requests, self._requests = self._requests, []
            for req in requests:
                req.error = StoreError("the journal store failed")
                req.done.set()
            if not batch:
                with self.cond:
                    if self._closing and not self.queue:
                        return
                    self.cond.wait(0.1)
                continue
            handles = [op.handle for op in batch if op.handle is not None]
            self._fail_ops(batch, handles, self.failed)

    # -- checkpoints and files (also used by gc) ---------------------------------------------------

    def checkpoint(self, *, write_marker: bool = True) -> None:
        """Commit the index with the journal complete (and synced) up to the head position."""
        head = self.head
        seq_records = self.state.take_cancelled_seqs()
        seq_ops = [Op.of(record) for record in seq_records]
        held: list[fmt.DestSeq] = []
        if seq_ops:
            try:
                self.write(seq_ops)
            except DiskFullError as exc:
                # Nothing was written; the index commit below holds them until there is room
                # (a close on a full disk must not let them be handed out again).
                log.info("journal: last sequences held in the index for now: %s", exc)
                self.state.hold_seqs(seq_records)
                held = seq_records
            else:
                self._apply(seq_ops)
        position = (head.file_no, head.offset)
        if position == self._cp_position and not self.state.dirty:
            return
        if self.durable and head.unsynced:
            self._sync()
        self.state.file_seen(head.file_no, head.offset)
        self.state.flush(position)
        try:
            self.state.index.commit(reopen=True)
        except DiskFullError as exc:
            self._index_no_room(exc, position)
            # The state came back from the last commit and the journal: sequences held only
            # in the lost transaction are noted again for the next checkpoint.
            for record in held:
                self.state.note_cancelled(record.destination, record.seq)
            raise
        if self.index_no_space:
            self.index_no_space = False
            log.info(
                "journal: index checkpoint taken again after %.1f s without room",
                time.monotonic() - self._index_full_since,
            )
        cleanups, self._cleanups = self._cleanups, []
        with self.lock:
            self.overlay.drop(cleanups)
            self.stats.checkpoints += 1
        self._last_checkpoint = time.monotonic()
        if write_marker:
            # Informational (dump and audits); it sits at the checkpoint position, so replay
            # reads it and nothing depends on it being durable (nor on it being there at all,
            # when the disk had no room for it).
            marker = Op.of(fmt.Checkpoint(position[0], position[1], int(time.time() * 1000)))
            with contextlib.suppress(DiskFullError):
                self.write([marker])
        self._cp_position = (head.file_no, head.offset)

    def _index_no_room(self, exc: DiskFullError, position: tuple[int, int]) -> None:
        """The index commit found no room and LMDB dropped its transaction; the index on disk
        is as the last checkpoint left it. Take the journal's records since then into a new
        transaction and count the store as full until a commit goes through. Readers see no
        change: they read the last commit and the overlay, whose cleanups wait for a commit."""
        redo_since_commit(self.state, self.journal_dir, position)
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
        self.checkpoint()
        self._retire_unneeded(result)
        if compact:
            targets = gc.compaction_targets(
                self.state, self.head.file_no, self.config.compaction_live_ratio
            )
            if targets:
                ops = gc.copy_ops(self.state, self.reader, self.journal_dir, targets, result)
                try:
                    self.write_durable(ops)
                except DiskFullError as exc:
                    log.warning("journal compaction put off: %s", exc)
                else:
                    self.checkpoint()
                    result.compacted = targets
                    result.moved_messages = sum(1 for op in ops if op.rtype == fmt.RecordType.ADD)
                    with self.lock:
                        self.stats.compacted_files += len(targets)
                        self.stats.damaged_records += result.damaged_records
                    self._retire_unneeded(result)
        for line in result.lines():
            log.info("journal gc: %s", line)
        return result

    def _retire_unneeded(self, result: GcResult) -> None:
        retire = gc.deletable(self.state, self.head.file_no)
        if not retire:
            return
        archive = self.config.archive and self.durable
        self.retire_files(retire, archive)
        (result.archived if archive else result.deleted).extend(retire)
        self.checkpoint()

    def retire_files(self, file_nos: Sequence[int], archive: bool) -> None:
        """Delete data files, or move them to the archive, once nothing needs them: first the
        FILES_RETIRED record that names them (synced), then the files."""
        if not file_nos:
            return
        self.write_durable([Op.of(gc.retired_after(self.state, list(file_nos), self.head.file_no))])
        gone: list[int] = []
        try:
            if archive:
                self.archive_dir.mkdir(parents=True, exist_ok=True)
            for file_no in file_nos:
                self._retire_file(file_no, archive)
                gone.append(file_no)
            fsync_dir(self.journal_dir)
            if archive:
                fsync_dir(self.archive_dir)
        finally:
            # What left the directory is gone whatever failed after it (a crash before the
            # directory sync may bring a file back: nothing in it is needed, the next
            # collection removes it again).
            self.state.files_gone(gone)
            with self.lock:
                self.stats.files -= len(gone)
                self.stats.disk_bytes -= len(gone) * self.head.file_bytes
                if archive:
                    self.stats.gc_archived_files += len(gone)
                else:
                    self.stats.gc_deleted_files += len(gone)

    def _retire_file(self, file_no: int, archive: bool) -> None:
        path = file_path(self.journal_dir, file_no)
        data_bytes = self.state.files[file_no].data_bytes
        self.reader.forget(file_no)
        with self.read_lock:
            self.store_reader.forget(file_no)
            if not archive:
                path.unlink(missing_ok=True)
                return
            target = self.archive_dir / path.name
            if not path.exists() and target.exists():
                return  # moved by an earlier collection that failed after the move
            if data_bytes:
                os.truncate(path, data_bytes)
            os.replace(path, target)


def _refusable(ops: Sequence[Op]) -> bool:
    """Whether every op may simply fail when there is no room: a message add or remove outside a
    transaction, whose requester is told (a producer gets no RECEIPT; an unrecorded ack means a
    redelivery), or a cursor move (written later). The others (transaction records, subscription
    and destination records, dispatch marks) would leave the store inconsistent: their failure
    fails the store, and a restart recovers from the journal."""
    for op in ops:
        record = op.record
        if isinstance(record, fmt.AddMeta | fmt.Remove):
            if record.txno:
                return False
        elif not isinstance(record, fmt.SubCursor):
            return False
    return True
