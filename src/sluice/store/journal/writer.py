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
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sluice.config import StoreConfig, SyncPolicy
from sluice.errors import StoreError
from sluice.store.api import CompletionSink, StoreStats, WriteHandle, WriteState
from sluice.store.journal import format as fmt
from sluice.store.journal import gc
from sluice.store.journal.files import FileReader, HeadFile, file_path, fsync_dir
from sluice.store.journal.gc import GcResult
from sluice.store.journal.ops import Op
from sluice.store.journal.overlay import Cleanup, Overlay
from sluice.store.journal.state import JournalState

log = logging.getLogger(__name__)

MAX_BATCH_OPS = 4096
MAX_BATCH_BYTES = 16 * 1024 * 1024


@dataclass
class _Request:
    kind: str
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
        now = time.monotonic()
        self._last_checkpoint = now
        self._last_sync = now
        self._last_gc = now
        self._cp_position = (head.file_no, head.offset)
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

    def request(self, kind: str) -> gc.GcResult | None:
        """Run a checkpoint or GC on the writer thread and wait for it (not from the loop)."""
        req = _Request(kind, threading.Event())
        with self.cond:
            if not self._thread.is_alive():
                raise StoreError("the journal writer is not running")
            self._requests.append(req)
            self.cond.notify()
        req.done.wait()
        if req.error is not None:
            raise req.error
        return req.result

    def pause(self) -> None:
        """Hold the writer before its next batch; returns once it is parked."""
        with self.cond:
            self._paused = True
            self.cond.notify_all()
            while not self._parked and self._thread.is_alive():
                self.cond.wait(0.05)

    def resume(self) -> None:
        """Let a paused writer go on."""
        with self.cond:
            self._paused = False
            self.cond.notify_all()

    def stop(self) -> None:
        """Drain the queue, checkpoint, and end the thread."""
        with self.cond:
            self._closing = True
            self._paused = False
            self.cond.notify_all()
        self._thread.join()

    # -- the thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        self.state.index.begin_write()
        try:
            self._loop()
        except BaseException as exc:  # the thread's boundary: fail loudly, never silently stop
            log.exception("journal writer failed")
            self._set_failed(exc)
            self._drain_failed()
        finally:
            self.state.index.abort()
            self.reader.close()

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
                    self.checkpoint(write_marker=False)
                return

    def _take(self) -> list[Op]:
        batch: list[Op] = []
        nbytes = 0
        queue = self.queue
        while queue and len(batch) < MAX_BATCH_OPS and (not batch or nbytes < MAX_BATCH_BYTES):
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
        if self.state.updates and (
            self.state.updates >= cfg.index_write_batch
            or now - self._last_checkpoint >= cfg.checkpoint_interval_s
        ):
            self.checkpoint()
        if now - self._last_gc >= cfg.gc_interval_s:
            self._last_gc = now
            try:
                self.collect()
            except StoreError as exc:
                # A damaged record found while compacting stops compaction, not the store.
                log.error("garbage collection stopped: %s", exc)

    def _serve(self, req: _Request) -> None:
        try:
            if self.failed is not None:
                raise StoreError("the journal store failed earlier") from self.failed
            if req.kind == "gc":
                req.result = self.collect()
            else:
                self.checkpoint()
        except BaseException as exc:
            req.error = exc
        req.done.set()

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
        if self.failed is not None:
            self._fail_ops(ops, handles, self.failed)
            return
        try:
            self.write(ops)
            if self.config.sync is SyncPolicy.ALWAYS and self.durable:
                self._sync()
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
        for op in batch:
            record = op.record
            if (
                isinstance(record, fmt.AddMeta)
                and not record.txno
                and op.handle is not None
                and op.handle.state is WriteState.CANCELLED
            ):
                self.state.note_cancelled(record.destination, record.seq)

    def write(self, ops: Sequence[Op]) -> None:
        """Append the ops' records, rolling over as needed; sets each op's location.

        Locations are set once every record is in its file: until then readers take a record
        from its op's parts (a location set earlier would send them to bytes not yet written)."""
        head = self.head
        buffers: list[bytes] = []
        placed: list[tuple[Op, tuple[int, int, int]]] = []
        pos = head.offset
        for op in ops:
            assert op.parts is not None
            header, length = fmt.frame(op.rtype, op.parts)
            if pos + length > head.file_bytes and pos > fmt.FILE_HEADER_RECORD_BYTES:
                if buffers:
                    head.write(buffers)
                    buffers = []
                self.state.file_seen(head.file_no, head.offset)
                head.rollover()
                self.state.file_seen(head.file_no, head.offset)
                with self.lock:
                    self.stats.files += 1
                    self.stats.disk_bytes += head.file_bytes
                pos = head.offset
            placed.append((op, (head.file_no, pos, length)))
            buffers.append(header)
            buffers.extend(op.parts)
            pos += length
        if buffers:
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
        seq_ops = [Op.of(record) for record in self.state.take_cancelled_seqs()]
        if seq_ops:
            self.write(seq_ops)
            self._apply(seq_ops)
        position = (head.file_no, head.offset)
        if position == self._cp_position and not self.state.dirty:
            return
        if self.durable and head.unsynced:
            self._sync()
        self.state.file_seen(head.file_no, head.offset)
        self.state.flush(position)
        self.state.index.commit(reopen=True)
        cleanups, self._cleanups = self._cleanups, []
        with self.lock:
            self.overlay.drop(cleanups)
            self.stats.checkpoints += 1
        self._last_checkpoint = time.monotonic()
        if write_marker:
            # Informational (dump and audits); it sits at the checkpoint position, so replay
            # reads it and nothing depends on it being durable.
            marker = Op.of(fmt.Checkpoint(position[0], position[1], int(time.time() * 1000)))
            self.write([marker])
        self._cp_position = (head.file_no, head.offset)

    # -- collection --------------------------------------------------------------------------------

    def collect(self, *, compact: bool = True) -> GcResult:
        """Checkpoint, compact what is worth it, then delete or archive what nothing needs."""
        result = GcResult()
        self.checkpoint()
        if compact:
            targets = gc.compaction_targets(
                self.state, self.head.file_no, self.config.compaction_live_ratio
            )
            if targets:
                ops = gc.copy_ops(self.state, self.reader, self.journal_dir, targets, result)
                self.write_durable(ops)
                self.checkpoint()
                result.compacted = targets
                result.moved_messages = sum(1 for op in ops if op.rtype == fmt.RecordType.ADD)
                with self.lock:
                    self.stats.compacted_files += len(targets)
                    self.stats.damaged_records += result.damaged_records
        retire = gc.deletable(self.state, self.head.file_no)
        if retire:
            archive = self.config.archive and self.durable
            self.retire_files(retire, archive)
            if archive:
                result.archived = retire
            else:
                result.deleted = retire
            self.checkpoint()
        for line in result.lines():
            log.info("journal gc: %s", line)
        return result

    def retire_files(self, file_nos: Sequence[int], archive: bool) -> None:
        """Delete data files, or move them to the archive, once nothing needs them: first the
        FILES_RETIRED record that names them (synced), then the files."""
        if not file_nos:
            return
        self.write_durable([Op.of(gc.retired_after(self.state, list(file_nos), self.head.file_no))])
        if archive:
            self.archive_dir.mkdir(parents=True, exist_ok=True)
        for file_no in file_nos:
            path = file_path(self.journal_dir, file_no)
            data_bytes = self.state.files[file_no].data_bytes
            self.reader.forget(file_no)
            with self.read_lock:
                self.store_reader.forget(file_no)
                if archive:
                    if data_bytes:
                        os.truncate(path, data_bytes)
                    os.replace(path, self.archive_dir / path.name)
                else:
                    path.unlink(missing_ok=True)
        fsync_dir(self.journal_dir)
        if archive:
            fsync_dir(self.archive_dir)
        self.state.files_gone(file_nos)
        with self.lock:
            self.stats.files -= len(file_nos)
            self.stats.disk_bytes -= len(file_nos) * self.head.file_bytes
            if archive:
                self.stats.gc_archived_files += len(file_nos)
            else:
                self.stats.gc_deleted_files += len(file_nos)
