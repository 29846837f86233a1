"""`JournalStore`: the persistent `MessageStore` on a KahaDB-style journal and an LMDB index.

Threads: the caller (the broker's event loop) runs every method; the writer thread
(`writer.Writer`) writes, syncs, completes handles through the sink, maintains the index (through
`appender.Appender`) and runs checkpoints and GC (`maintenance.Maintenance`); the preallocator
thread zero-fills the next data file.

Locks: `_lock` guards the pending queue, handle states, the overlay and the stats, and is held only
for in-memory bookkeeping (never across I/O). `_read_lock` guards this store's read descriptors
against the writer deleting files: a reader takes it first (then `_lock` for its snapshot), the
writer takes it alone to delete. Nothing is held while the event loop would wait for the disk,
except `load()`, which reads message records back with `pread` (usually from the page cache).

Memory: a stored message costs nothing in memory once the index has committed it; until then the
overlay holds its op (with the record bytes only until they are written). A transaction keeps one
small op per add (its location), never the messages.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from sluice.config import DEFAULT_DEDUP_WINDOW, StoreConfig, SyncPolicy
from sluice.errors import CorruptionError, DiskFullError, StoreError
from sluice.store.api import (
    CompletionSink,
    Fence,
    RecoveredSubscription,
    Recovery,
    StoreCapabilities,
    StoredMessage,
    StoreStats,
    StoreView,
    TimedWriteHandle,
    WriteHandle,
    WriteState,
    take_for_commit,
)
from sluice.store.journal import format as fmt
from sluice.store.journal.files import (
    FileReader,
    Preallocator,
    file_path,
    free_bytes,
    list_files,
)
from sluice.store.journal.gc import GcResult
from sluice.store.journal.index import Index
from sluice.store.journal.indexcodec import MsgLoc, dkey, msg_key
from sluice.store.journal.inspect import inspect_journal
from sluice.store.journal.ops import Op
from sluice.store.journal.overlay import MAX_SEQ, Overlay, Removed
from sluice.store.journal.recovery import recover
from sluice.store.journal.scan import parse_add
from sluice.store.journal.writer import RequestKind, Writer

log = logging.getLogger(__name__)

# Index entries `first_seq` looks at per hold of the store's lock.
FIRST_SEQ_CHUNK = 256
# `load` reads neighbouring records of one data file with one pread: records at most this far
# apart, and at most this many bytes in all.
PAGE_GAP_BYTES = 64 * 1024
PAGE_MAX_BYTES = 1024 * 1024

# What load() picked: committed location, or the record bytes of a not yet written add.
_Source = tuple[int, int, int] | list[bytes]


@dataclass
class _Tx:
    txno: int
    begun: bool = False
    adds: list[Op] = field(default_factory=list)
    removes: list[tuple[str, int]] = field(default_factory=list)


class JournalStore:
    """The journal store. `temporary=True` makes a spool for non-persistent messages: the
    directory is cleared at open, nothing is synced, nothing archived. `time_writes=True` makes
    `add` return `TimedWriteHandle`s, stamped as they go through the store and the writer (the
    broker's per-hop latency; the cost of one test per add when off). With a `fence` (high
    availability), the store checks it before it recovers and before every write, and starts a
    new data file at open: this master never appends to a file an earlier master had open."""

    capabilities = StoreCapabilities(pages_to_disk=True, durable=True, data_files=True)

    def __init__(
        self,
        config: StoreConfig,
        *,
        dedup_window: int = DEFAULT_DEDUP_WINDOW,
        temporary: bool = False,
        time_writes: bool = False,
        fence: Fence | None = None,
    ) -> None:
        if temporary:
            config = dataclasses.replace(config, sync=SyncPolicy.NEVER, archive=False)
        self.config = config
        self.temporary = temporary
        if temporary:
            self.capabilities = dataclasses.replace(self.capabilities, durable=False)
        self.dedup_window = dedup_window
        self.journal_dir = config.data_dir / "journal"
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._read_lock = threading.Lock()
        self._overlay = Overlay()
        self._stats = StoreStats()
        self._txs: dict[str, _Tx] = {}
        self._next_txno = 1
        self._writer: Writer | None = None
        self._index: Index | None = None
        self._prealloc: Preallocator | None = None
        self._reader = FileReader(self.journal_dir)
        self._timed = time_writes
        self._fence = fence
        self._new_handle: type[WriteHandle] = TimedWriteHandle if time_writes else WriteHandle
        # Removes without a completion callback are synced by the next sync (`Op.lazy`).
        self._lazy_removes = not config.sync_acks

    # -- lifecycle -------------------------------------------------------------------------------

    def open(self, sink: CompletionSink) -> Recovery:
        """Recover the journal and index, start the writer, return what is stored."""
        if self._writer is not None:
            raise StoreError("store already open", str(self.config.data_dir))
        if self.temporary:
            for sub in ("journal", "index", "archive"):
                shutil.rmtree(self.config.data_dir / sub, ignore_errors=True)
        if self._fence is not None:
            self._fence.check()
        recovered = recover(self.config, dedup_window=self.dedup_window, durable=not self.temporary)
        state = recovered.state
        head = recovered.head
        assert head is not None
        destinations, subscriptions = state.recovered()
        self._index = state.index
        self._next_txno = state.next_txno
        # The temp store makes each data file when it needs it: it holds no spare on the disk.
        self._prealloc = Preallocator(
            self.journal_dir,
            recovered.store_id,
            self.config.journal_file_bytes,
            ahead=not self.temporary,
            durable=not self.temporary,
        )
        head.attach(self._prealloc, sync_on_rollover=not self.temporary)
        if self._fence is not None:
            # A write the previous master had under way as it lost the lease (frozen between
            # its fence check and its write) can only land in a file this master never writes.
            state.file_seen(head.file_no, head.offset)
            head.rollover()
            state.file_seen(head.file_no, head.offset)
        files = list_files(self.journal_dir)
        self._stats.files = len(files)
        self._stats.disk_bytes = sum(file_path(self.journal_dir, n).stat().st_size for n in files)
        self._writer = Writer(
            config=self.config,
            durable=not self.temporary,
            state=state,
            head=head,
            lock=self._lock,
            cond=self._cond,
            overlay=self._overlay,
            stats=self._stats,
            sink=sink,
            read_lock=self._read_lock,
            store_reader=self._reader,
            journal_dir=self.journal_dir,
            archive_dir=self.config.data_dir / "archive",
            timed=self._timed,
            fence=self._fence,
        )
        self._writer.start()
        log.info(
            "journal store open at %s: %d destinations, %d subscriptions, head db-%d.log:%d%s",
            self.config.data_dir,
            len(destinations),
            len(subscriptions),
            head.file_no,
            head.offset,
            " (index rebuilt)" if recovered.rebuilt else "",
        )
        return Recovery(destinations, subscriptions, list(recovered.report))

    def close(self) -> None:
        """Write what is pending, persist cursors, checkpoint the index, release everything."""
        writer = self._writer
        if writer is None:
            return
        self._writer = None
        stopped = writer.stop()
        if self._prealloc is not None:
            try:
                self._prealloc.stop()
            except OSError as exc:
                # An unused spare left behind is removed at the next open; go on releasing.
                log.error("journal: removing the unused spare file failed: %s", exc.strerror)
        if not stopped:
            # Its thread still holds the head file and the index: leave both; the next start
            # replays the journal from the last checkpoint, as after a crash.
            return
        ok = writer.failed is None
        try:
            writer.head.close(sync=ok)
        except OSError as exc:
            ok = False
            log.error("journal: closing %s failed: %s", writer.head.path, exc.strerror)
        with self._read_lock:
            try:
                self._reader.close()
            except OSError as exc:
                log.error("journal: closing a read descriptor failed: %s", exc.strerror)
        assert self._index is not None
        try:
            self._index.close(clean=ok)
        except OSError as exc:
            # Only the clean marker is missing: the next start checks the index in full.
            log.error("journal: closing the index cleanly failed: %s", exc.strerror)

    @property
    def _w(self) -> Writer:
        writer = self._writer
        if writer is None:
            raise StoreError("store is not open", str(self.config.data_dir))
        return writer

    # -- messages --------------------------------------------------------------------------------

    def add(
        self,
        message: StoredMessage,
        on_complete: Callable[[WriteHandle], None] | None,
        txid: str | None = None,
    ) -> WriteHandle:
        """Queue the message's ADD record; visible to `load` at once (at commit if transacted)."""
        writer = self._w
        handle = self._new_handle(on_complete, message.size, self._lock)
        if txid is None:
            prefix, body, meta = fmt.encode_add(message)
            op = Op(fmt.RecordType.ADD, meta, [prefix, body], handle)
            op.cleanup = [(message.destination, message.seq, op)]
            with self._lock:
                self._overlay.put(message.destination, message.seq, op)
                writer.submit(op)
                if self._timed:
                    _stamp_queued(handle)
            return handle
        tx = self._tx(txid)
        prefix, body, meta = fmt.encode_add(message, tx.txno, len(tx.adds))
        op = Op(fmt.RecordType.ADD, meta, [prefix, body], handle)
        with self._lock:
            self._begin_locked(writer, tx, txid)
            writer.submit(op)
        tx.adds.append(op)
        return handle

    def remove(
        self,
        destination: str,
        seq: int,
        on_complete: Callable[[WriteHandle], None] | None = None,
        txid: str | None = None,
    ) -> WriteHandle:
        """Queue a REMOVE, or cancel a still pending add together with this remove."""
        writer = self._w
        handle = WriteHandle(on_complete, 0, self._lock)
        if txid is not None:
            tx = self._tx(txid)
            op = Op.of(fmt.Remove(tx.txno, destination, seq), handle)
            with self._lock:
                self._begin_locked(writer, tx, txid)
                writer.submit(op)
            tx.removes.append((destination, seq))
            return handle
        op = Op.of(fmt.Remove(0, destination, seq), handle)
        op.lazy = on_complete is None and self._lazy_removes
        removed = Removed()
        op.cleanup = [(destination, seq, removed)]
        with self._lock:
            entries = self._overlay.entries.get(destination)
            entry = entries.get(seq) if entries is not None else None
            if isinstance(entry, Op) and self._cancellable(entry):
                assert entry.handle is not None
                entry.handle.state = WriteState.CANCELLED
                handle.state = WriteState.CANCELLED
                self._overlay.discard(destination, seq)
                self._stats.cancelled_writes += 1
                writer.submit(Op(0, None, None, handle))
                return handle
            if isinstance(entry, Op):
                op.replaced = entry
            self._overlay.put(destination, seq, removed)
            writer.submit(op)
        return handle

    @staticmethod
    def _cancellable(op: Op) -> bool:
        record = op.record
        return (
            op.handle is not None
            and op.handle.state is WriteState.PENDING
            and isinstance(record, fmt.AddMeta)
            and not record.txno
            # An add with a dedup id is written anyway: its id must survive a restart.
            and not record.dedup_id
        )

    def remove_range(self, destination: str, upto_seq: int) -> WriteHandle:
        """Queue a REMOVE_RANGE; hidden from `load` at once."""
        writer = self._w
        handle = WriteHandle(None, 0, self._lock)
        op = Op.of(fmt.RemoveRange(destination, upto_seq), handle)
        op.cleanup = [(destination, -1, op)]
        with self._lock:
            self._overlay.set_floor(destination, upto_seq, op)
            writer.submit(op)
        return handle

    def load(
        self, destination: str, after_seq: int, max_count: int, max_bytes: int
    ) -> list[StoredMessage]:
        """Messages after `after_seq`, ascending, within the budgets (at least one). A record
        that fails its checks is reported, counted and dropped, and the page continues."""
        index = self._index
        if index is None:
            raise StoreError("store is not open", str(self.config.data_dir))
        out: list[StoredMessage] = []
        total = 0
        with self._read_lock:
            while True:
                picks: list[tuple[int, int, _Source]] = []
                with self._lock:
                    for seq, size, _ts, source in self._merged(index, destination, after_seq):
                        if (out or picks) and (
                            len(out) + len(picks) >= max_count or total + size > max_bytes
                        ):
                            break
                        picks.append((seq, size, source))
                        total += size
                damaged = False
                for seq, size, read in self._read_page(destination, picks):
                    after_seq = seq
                    if isinstance(read, CorruptionError):
                        self._drop_damaged(destination, seq, read)
                        total -= size
                        damaged = True
                        continue
                    out.append(read)
                # A dropped record freed room: fill it from what follows.
                if not damaged:
                    return out

    def _read_page(
        self, destination: str, picks: list[tuple[int, int, _Source]]
    ) -> Iterator[tuple[int, int, StoredMessage | CorruptionError]]:
        """Each pick's message, or the error its record fails with. Neighbouring records of one
        file (gaps under `PAGE_GAP_BYTES`, at most `PAGE_MAX_BYTES` in all) are read with one
        pread; a page that cannot be read is read again record by record, so that the damage is
        pinned on the records it is in."""
        i, count = 0, len(picks)
        while i < count:
            seq, size, source = picks[i]
            if isinstance(source, list):
                yield seq, size, self._read_one(destination, seq, source)
                i += 1
                continue
            file_no, start, length = source
            end = start + length
            j = i + 1
            while j < count:
                nxt = picks[j][2]
                if (
                    isinstance(nxt, list)
                    or nxt[0] != file_no
                    or not end <= nxt[1] <= end + PAGE_GAP_BYTES
                    or nxt[1] + nxt[2] - start > PAGE_MAX_BYTES
                ):
                    break
                end = nxt[1] + nxt[2]
                j += 1
            page: bytes | None = None
            if j - i > 1:
                try:
                    page = self._reader.read(file_no, start, end - start, PAGE_MAX_BYTES)
                except CorruptionError:
                    page = None
            if page is None:
                for seq, size, source in picks[i:j]:
                    yield seq, size, self._read_one(destination, seq, source)
            else:
                view = memoryview(page)
                path = self._reader.path(file_no)
                for seq, size, source in picks[i:j]:
                    assert not isinstance(source, list)  # a page holds written records only
                    _, offset, length = source
                    data = view[offset - start : offset - start + length]
                    try:
                        message = parse_add(
                            data, path, offset, length, destination=destination, seq=seq
                        )
                    except CorruptionError as exc:
                        yield seq, size, exc
                        continue
                    message.seq = seq
                    yield seq, size, message
            i = j

    def _read_one(
        self, destination: str, seq: int, source: _Source
    ) -> StoredMessage | CorruptionError:
        try:
            return self._read(destination, seq, source)
        except CorruptionError as exc:
            return exc

    def _read(self, destination: str, seq: int, source: _Source) -> StoredMessage:
        if isinstance(source, list):
            message, _ = fmt.decode_add(b"".join(source))
        else:
            file_no, offset, length = source
            data = self._reader.read(file_no, offset, length)
            path = self._reader.path(file_no)
            message = parse_add(data, path, offset, length, destination=destination, seq=seq)
        message.seq = seq
        return message

    def _drop_damaged(self, destination: str, seq: int, exc: CorruptionError) -> None:
        """A stored message cannot be read back: say where, count it, and remove it so the
        destination goes on with the rest (the REMOVE record keeps a rebuild from seeing it)."""
        log.error(
            "journal: message %d of %s dropped, its record is damaged: %s", seq, destination, exc
        )
        with self._lock:
            self._stats.damaged_records += 1
        self.remove(destination, seq)

    def first_seq(self, destination: str, at_or_after_ms: int = 0) -> int:
        """Lowest stored sequence, or the first stamped at or after `at_or_after_ms` (0 if none).

        With a time this walks the destination's index entries in order (no time index)."""
        index = self._index
        if index is None:
            raise StoreError("store is not open", str(self.config.data_dir))
        after = 0
        while True:
            # At most FIRST_SEQ_CHUNK entries per hold of the lock, which the writer takes to
            # take each batch: a long scan must not stall group commit.
            scanned = 0
            with self._lock:
                for seq, _size, ts, _source in self._merged(index, destination, after):
                    if ts >= at_or_after_ms:
                        return seq
                    after = seq
                    scanned += 1
                    if scanned >= FIRST_SEQ_CHUNK:
                        break
            if scanned < FIRST_SEQ_CHUNK:
                return 0

    def _merged(
        self, index: Index, destination: str, after_seq: int
    ) -> Iterator[tuple[int, int, int, _Source]]:
        """(seq, size, timestamp, source) of live messages after `after_seq`, merging the overlay
        over an index snapshot. The caller holds `_lock` while iterating."""
        entries = self._overlay.entries.get(destination)
        floor = self._overlay.floor(destination)
        ov = iter(entries.irange(minimum=after_seq + 1)) if entries else iter(())
        next_ov: int | None = next(ov, None)
        dk = dkey(destination)
        with index.begin_read() as txn:
            cur = txn.cursor(db=index.dbs[b"msgs"])
            start = max(after_seq, floor) + 1
            positioned = start <= MAX_SEQ and cur.set_range(msg_key(dk, start))
            while True:
                next_ix: int | None = None
                if positioned:
                    key = cur.key()
                    if key[:16] == dk:
                        next_ix = int.from_bytes(key[16:], "big")
                if next_ov is None and next_ix is None:
                    return
                if next_ix is None or (next_ov is not None and next_ov <= next_ix):
                    seq = next_ov
                    assert seq is not None
                    assert entries is not None
                    if next_ix == seq:
                        positioned = cur.next()
                    next_ov = next(ov, None)
                    entry = entries[seq]
                    if isinstance(entry, Removed):
                        continue
                    assert isinstance(entry, Op)
                    assert isinstance(entry.record, fmt.AddMeta)
                    meta = entry.record
                    source: _Source = entry.location or entry.parts or []
                    if entry.location is None and entry.parts is None:
                        continue
                    yield seq, meta.size, meta.timestamp_ms, source
                else:
                    loc = MsgLoc.decode(cur.value())
                    positioned = cur.next()
                    yield next_ix, loc.size, loc.timestamp_ms, (loc.file_no, loc.offset, loc.length)

    # -- transactions ----------------------------------------------------------------------------

    def _tx(self, txid: str) -> _Tx:
        tx = self._txs.get(txid)
        if tx is None:
            tx = self._txs[txid] = _Tx(self._next_txno)
            self._next_txno += 1
        return tx

    @staticmethod
    def _begin_locked(writer: Writer, tx: _Tx, txid: str) -> None:
        if not tx.begun:
            tx.begun = True
            writer.submit(Op.of(fmt.TxBegin(tx.txno, txid)))

    def begin(self, txid: str) -> None:
        """Start a transaction; nothing is written before its first operation."""
        self._tx(txid)

    def commit(
        self, txid: str, seqs: Sequence[int], on_complete: Callable[[WriteHandle], None] | None
    ) -> WriteHandle:
        """Queue the TX_COMMIT with the sequences; its adds and removes show at once."""
        writer = self._w
        tx = take_for_commit(self._txs, txid, seqs)
        handle = WriteHandle(on_complete, 0, self._lock)
        if tx is None or not tx.begun:
            handle.state = WriteState.WRITTEN
            with self._lock:
                writer.submit(Op(0, None, None, handle))
            return handle
        op = Op.of(fmt.TxCommit(tx.txno, tuple(seqs)), handle)
        cleanup: list[tuple[str, int, object]] = []
        with self._lock:
            for add_op, seq in zip(tx.adds, seqs, strict=True):
                assert add_op.handle is not None
                assert isinstance(add_op.record, fmt.AddMeta)
                if add_op.handle.state in (WriteState.CANCELLED, WriteState.FAILED):
                    continue
                destination = add_op.record.destination
                self._overlay.put(destination, seq, add_op)
                cleanup.append((destination, seq, add_op))
            for destination, seq in tx.removes:
                removed = Removed()
                self._overlay.put(destination, seq, removed)
                cleanup.append((destination, seq, removed))
            op.cleanup = cleanup
            writer.submit(op)
        return handle

    def abort(self, txid: str) -> None:
        """Drop the transaction; its adds not yet taken by the writer are never written."""
        writer = self._w
        tx = self._txs.pop(txid, None)
        if tx is None or not tx.begun:
            return
        with self._lock:
            for op in tx.adds:
                if op.handle is not None and op.handle.state is WriteState.PENDING:
                    op.handle.state = WriteState.CANCELLED
            writer.submit(Op.of(fmt.TxAbort(tx.txno)))

    # -- destinations and subscriptions ----------------------------------------------------------

    def _submit(self, record: fmt.Record) -> WriteHandle:
        writer = self._w
        handle = WriteHandle(None, 0, self._lock)
        op = Op.of(record, handle)
        with self._lock:
            writer.submit(op)
        return handle

    def mark_dispatched(self, destination: str, seq: int) -> WriteHandle:
        """Queue a DISPATCH_MARK."""
        return self._submit(fmt.DispatchMark(destination, seq))

    def delete_destination(self, destination: str) -> WriteHandle:
        """Queue a DEST_DELETE; the destination's messages are hidden at once, and open
        transactions forget their removes of them (as the index does when it applies the
        record)."""
        writer = self._w
        handle = WriteHandle(None, 0, self._lock)
        op = Op.of(fmt.DestDelete(destination), handle)
        op.cleanup = [(destination, -1, op)]
        for tx in self._txs.values():
            tx.removes = [(name, seq) for name, seq in tx.removes if name != destination]
        with self._lock:
            self._overlay.set_floor(destination, MAX_SEQ, op)
            writer.submit(op)
        return handle

    def put_subscription(self, sub: RecoveredSubscription) -> WriteHandle:
        """Queue a SUB_PUT (its cursor replaces any coalesced one)."""
        record = fmt.SubPut(sub.client_id, sub.name, sub.destination, sub.selector, sub.cursor)
        with self._lock:
            self._w.cursors.pop((sub.client_id, sub.name), None)
        return self._submit(record)

    def delete_subscription(self, client_id: str, name: str) -> WriteHandle:
        """Queue a SUB_DELETE."""
        with self._lock:
            self._w.cursors.pop((client_id, name), None)
        return self._submit(fmt.SubDelete(client_id, name))

    def set_cursor(self, client_id: str, name: str, seq: int) -> None:
        """Coalesced: one SUB_CURSOR per subscription goes with the next batch or checkpoint."""
        with self._lock:
            self._w.cursors[(client_id, name)] = seq

    # -- numbers and maintenance -----------------------------------------------------------------

    def stats(self) -> StoreStats:
        """A snapshot of the store's numbers (disk bytes include the index)."""
        with self._lock:
            snapshot = dataclasses.replace(self._stats)
        index_bytes = self._index.size_bytes() if self._index is not None else 0
        snapshot.disk_bytes += index_bytes
        writer, prealloc = self._writer, self._prealloc
        if writer is not None and prealloc is not None:
            head = writer.head
            # Racy reads of ints the writer moves: a gauge, refreshed every check.
            unwritten = head.free_in_file
            prepared = prealloc.file_bytes if head.next_ready() else 0
            snapshot.preallocated_bytes = unwritten + prepared
            snapshot.data_bytes = max(0, snapshot.disk_bytes - unwritten)
            snapshot.no_space = writer.index_no_space or (
                isinstance(prealloc.error, DiskFullError) and not prepared
            )
        try:
            snapshot.disk_free_bytes = free_bytes(self.config.data_dir)
        except OSError:
            snapshot.disk_free_bytes = -1
        return snapshot

    def inspect(self, max_messages: int) -> StoreView:
        """The data files and the archive as the index's last checkpoint has them (an LMDB
        read transaction: safe on any thread, never waits for the writer)."""
        index, writer = self._index, self._writer
        kind = "temp" if self.temporary else "journal"
        if index is None or writer is None:
            return StoreView(kind, str(self.config.data_dir), complete=False)
        head = writer.head
        # Racy reads of ints the writer moves: where it writes now, give or take a batch.
        view = inspect_journal(
            index, self.config.data_dir, (head.file_no, head.offset), max_messages
        )
        return dataclasses.replace(view, kind=kind)

    def gc(self) -> GcResult:
        """Collect and compact on the writer thread once every write queued before is written;
        blocks (tools and tests, not the loop)."""
        result = self._w.request(RequestKind.GC)
        assert result is not None
        return result

    def checkpoint(self) -> None:
        """Commit the index on the writer thread once every write queued before is written;
        blocks (tools and tests, not the loop)."""
        self._w.request(RequestKind.CHECKPOINT)

    @contextlib.contextmanager
    def writes_paused(self) -> Iterator[None]:
        """Hold the writer before its next batch while the block runs (tests and tools)."""
        writer = self._w
        writer.pause()
        try:
            yield
        finally:
            writer.resume()

    @property
    def head_position(self) -> tuple[int, int]:
        """(file, offset) where the next record goes."""
        head = self._w.head
        return head.file_no, head.offset


def _stamp_queued(handle: WriteHandle) -> None:
    """The op is in the writer's queue (stamped under the lock the writer takes it with)."""
    assert isinstance(handle, TimedWriteHandle)
    handle.queued_ns = time.perf_counter_ns()
