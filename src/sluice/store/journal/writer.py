"""The group-commit writer: one thread that drains the pending queue into the journal.

Each turn it takes everything pending (up to a batch bound) under the store lock, marking handles
TAKEN so they can no longer be cancelled; writes the batch with `pwritev` calls (one per file
touched, IOV_MAX buffers at a time); syncs once when the policy is ALWAYS, unless every record
of the batch is lazy (`Op.lazy`: a remove nobody waits for, a cursor move; the next sync covers
them, at the latest `sync_interval_ms` later); marks the handles
WRITTEN and hands them all to the completion sink in one call; then applies the records to the
index. The records' bytes and their effect on the index go through `appender.Appender`;
checkpoints (every `index_write_batch` records or `checkpoint_interval_s`), collection and
compaction run on this thread too, between batches, in `maintenance.Maintenance`. This module is
the thread: its queue and batches, its timers, requests from other threads (checkpoint, GC),
pause, resume and stop, and what happens to writes when the store fails.

The event-loop thread never waits for this thread's I/O: the lock is only held for queue and
handle bookkeeping, never across a write, sync or index commit.

Failures. A batch that needs the next data file has that file prepared before any of its bytes is
written; when the disk has no room for it (`DiskFullError`), the batch's handles fail with that
error and the store goes on: nothing was written, and it takes writes again once space is back.
Any other failure to write or sync (EIO, a failed fsync, ENOSPC in the middle of a batch) fails
the store: its data is never taken as safe, every later write fails, and a restart recovers from
the journal. An index commit that finds no room is not a failure (see `maintenance.py`); any
other index commit error fails the store. Every wait on this thread from another one is bounded,
and ends when it stops.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sluice.config import StoreConfig, SyncPolicy
from sluice.errors import DiskFullError, FencedError, StoreError
from sluice.store.api import (
    BatchTimes,
    CompletionSink,
    Fence,
    StoreStats,
    TimedWriteHandle,
    WriteHandle,
    WriteState,
)
from sluice.store.journal import format as fmt
from sluice.store.journal.appender import Appender
from sluice.store.journal.files import FileReader, HeadFile
from sluice.store.journal.gc import GcResult
from sluice.store.journal.maintenance import Maintenance
from sluice.store.journal.ops import Op
from sluice.store.journal.overlay import Overlay
from sluice.store.journal.state import JournalState

log = logging.getLogger(__name__)

MAX_BATCH_OPS = 4096
MAX_BATCH_BYTES = 16 * 1024 * 1024
# How long another thread waits for the writer: to run a request, to park, to stop.
REQUEST_TIMEOUT_S = 300.0
PAUSE_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0


class RequestKind(enum.Enum):
    """What another thread asks the writer thread to run."""

    CHECKPOINT = "checkpoint"
    GC = "gc"


@dataclass
class _Request:
    kind: RequestKind
    done: threading.Event
    # Served once the writer has taken this many ops: every op queued before the request.
    after_ops: int = 0
    result: GcResult | None = None
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
        timed: bool = False,
        fence: Fence | None = None,
    ) -> None:
        self.config = config
        # High availability: checked before every batch, sync and maintenance round, and again
        # before a batch is confirmed (a broker that lost its lease writes and confirms nothing).
        self.fence = fence
        # Stamp each batch's progress on its timed handles (`BatchTimes`): the broker's
        # per-hop latency of persistent sends.
        self.timed = timed
        self.durable = durable
        self.state = state
        self.head = head
        self.lock = lock
        self.cond = cond
        self.overlay = overlay
        self.stats = stats
        self.sink = sink
        self.queue: deque[Op] = deque()
        self.cursors: dict[tuple[str, str], int] = {}
        self.failed: BaseException | None = None
        self._appender = Appender(head=head, state=state, lock=lock, stats=stats, durable=durable)
        self._maintenance = Maintenance(
            config=config,
            durable=durable,
            state=state,
            appender=self._appender,
            lock=lock,
            overlay=overlay,
            stats=stats,
            read_lock=read_lock,
            store_reader=store_reader,
            journal_dir=journal_dir,
            archive_dir=archive_dir,
            fail=self._set_failed,
            fence=fence,
        )
        self._requests: list[_Request] = []
        # Ops ever queued and ever taken into a batch (a request waits for those before it).
        self._submitted_ops = 0
        self._taken_ops = 0
        self._paused = False
        self._parked = False
        self._closing = False
        # The thread has ended: requests are refused, waits end.
        self._ended = False
        # A batch needs about one rollover at most, so it is never held up by two new files.
        self._max_batch_bytes = min(MAX_BATCH_BYTES, max(head.file_bytes // 2, 1))
        self._thread = threading.Thread(target=self._run, name="sluice-journal", daemon=True)

    @property
    def index_no_space(self) -> bool:
        """The last index commit found no room: the store counts as full until one goes through."""
        return self._maintenance.index_no_space

    # -- called by the store (holding `lock` where noted) ------------------------------------------

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def submit(self, op: Op) -> None:
        """Queue an op. The caller holds `lock`."""
        self.queue.append(op)
        self._submitted_ops += 1
        self.stats.pending_writes += 1
        self.stats.pending_write_bytes += op.nbytes
        self.cond.notify()

    def request(self, kind: RequestKind, timeout_s: float = REQUEST_TIMEOUT_S) -> GcResult | None:
        """Run a checkpoint or GC on the writer thread and wait for it (not from the loop).
        Raises `StoreError` when the writer is stopping, stopped or failed, or does not answer
        within `timeout_s`."""
        req = _Request(kind, threading.Event())
        with self.cond:
            req.after_ops = self._submitted_ops
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
            self._maintenance.close()
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
                # Under the lock the loop queues with: never before an op's `queued_ns`.
                taken_ns = time.perf_counter_ns() if self.timed else 0
                batch = self._take()
                cursors, self.cursors = self.cursors, {}
                requests = self._due_requests()
                finishing = self._closing and not self.queue
            if batch or cursors:
                self._process(batch, cursors, taken_ns)
            self._timers()
            for req in requests:
                self._serve(req)
            if finishing:
                if self.failed is None and self._fenced_ok():
                    self._maintenance.closing_checkpoint()
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
        self._taken_ops += len(batch)
        self.stats.pending_writes -= len(batch)
        self.stats.pending_write_bytes -= nbytes
        return batch

    def _due_requests(self) -> list[_Request]:
        """Take the requests whose earlier ops are all in a batch by now (the lock held): a
        checkpoint or collection covers every write queued before it was asked for."""
        requests = self._requests
        if not requests or requests[-1].after_ops <= self._taken_ops:
            self._requests = []
            return requests
        due = [req for req in requests if req.after_ops <= self._taken_ops]
        self._requests = [req for req in requests if req.after_ops > self._taken_ops]
        return due

    def _sync_due(self) -> float:
        """When the head is next synced by time: `sync_interval_ms` after the last sync when it
        holds unsynced records (under PERIODIC, or lazy ones under ALWAYS); never otherwise."""
        if not self.head.unsynced or not self.durable or self.config.sync is SyncPolicy.NEVER:
            return float("inf")
        return self._appender.last_sync_s + self.config.sync_interval_ms / 1000

    def _next_due(self) -> float:
        due = self._maintenance.next_due(cursors_waiting=bool(self.cursors))
        return min(due, self._sync_due())

    def _timers(self) -> None:
        if self.failed is not None or not self._fenced_ok():
            return
        now = time.monotonic()
        if now >= self._sync_due():
            self._appender.sync()
        self._maintenance.run_due(now)

    def _serve(self, req: _Request) -> None:
        try:
            if self.failed is not None or not self._fenced_ok():
                raise StoreError("the journal store failed earlier") from self.failed
            if req.kind is RequestKind.GC:
                req.result = self._maintenance.collect()
            else:
                self._maintenance.checkpoint()
        except BaseException as exc:
            req.error = exc
            if isinstance(exc, OSError | StoreError) and self.failed is None:
                self._maintenance.round_failed(req.kind.value, exc)
        req.done.set()

    # -- batches -----------------------------------------------------------------------------------

    def _process(
        self, batch: list[Op], cursors: dict[tuple[str, str], int], taken_ns: int = 0
    ) -> None:
        handles: list[WriteHandle] = []
        ops: list[Op] = []
        for op in batch:
            handle = op.handle
            if handle is not None:
                handles.append(handle)
            if op.rtype and (handle is None or handle.state is WriteState.TAKEN):
                ops.append(op)
        lazy_cursors = not self.config.sync_acks
        for (client_id, name), seq in cursors.items():
            cursor = Op.of(fmt.SubCursor(client_id, name, seq))
            cursor.lazy = lazy_cursors
            ops.append(cursor)
        self._note_cancelled(batch)
        if self.failed is not None:
            self._fail_ops(ops, handles, self.failed)
            return
        times = BatchTimes(taken_ns) if self.timed else None
        fence = self.fence
        try:
            if fence is not None:
                fence.check()
            self._appender.write(ops, times)
            if times is not None:
                times.written_ns = times.synced_ns = time.perf_counter_ns()
            if (
                self.config.sync is SyncPolicy.ALWAYS
                and self.durable
                and not all(op.lazy for op in ops)
            ):
                # One sync for the batch, and for lazy records written before it.
                self._appender.sync()
                if times is not None:
                    times.synced_ns = time.perf_counter_ns()
            if fence is not None:
                # Lost while the batch was written (frozen between the check and the write):
                # nothing of it is confirmed.
                fence.check()
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
        if times is not None:
            _stamp_written(handles, times)
        self._deliver(handles)
        self._appender.apply(ops)

    def _note_cancelled(self, batch: Sequence[Op]) -> None:
        """Cancelled adds used their sequences whether this batch is written or refused (a
        destination delete applied with the batch forgets them)."""
        for op in batch:
            record = op.record
            if (
                isinstance(record, fmt.AddMeta)
                and not record.txno
                and op.handle is not None
                and op.handle.state is WriteState.CANCELLED
            ):
                self.state.note_cancelled(record.destination, record.seq)

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

    def _fenced_ok(self) -> bool:
        """Whether the fence (if any) lets this process write; when it does not, the store
        fails with `FencedError` and writes nothing more."""
        fence = self.fence
        if fence is None:
            return True
        try:
            fence.check()
        except FencedError as exc:
            self._set_failed(exc)
            return False
        return True

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
            cleanups = [op.take_cleanup() for op in ops]
            self.overlay.drop([cleanup for cleanup in cleanups if cleanup is not None])
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


def _stamp_written(handles: Sequence[WriteHandle], times: BatchTimes) -> None:
    """Give the batch's timed handles that were written their batch's times."""
    for handle in handles:
        if isinstance(handle, TimedWriteHandle) and handle.state is WriteState.WRITTEN:
            handle.batch = times


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
