"""`PostgresStore`: the persistent `MessageStore` on a PostgreSQL database (psycopg 3).

Threads and connections: the caller (the broker's event loop) runs every method; writes are
queued for the writer thread (`writer.Writer`), which owns one connection and commits each batch
in one transaction (group commit: the COMMIT is the sync). Reads (`load`, `first_seq`, `inspect`)
go through a second connection, in autocommit, under `_read_lock`.

The overlay. A write is visible to `load` as soon as it is queued, as with the journal: `_lock`
guards, per destination, the adds not yet committed (`_adds`, with their message until written),
the removes not yet committed (`_removed`), and a floor below which committed rows are hidden (a
`remove_range` or a destination delete not yet committed). The writer drops an op's entries once
its transaction has committed. A read takes its overlay snapshot first and queries the database
after: what the writer commits in between is then in the database (the rows) or already hidden
(the removes), so nothing is missed and nothing removed shows again.

A lost connection: the writer connects again and finishes its batch (see `writer`); a read
whose connection is lost connects again at once and is tried once more, and otherwise fails with
`StoreOfflineError` (the core tries its dispatch again later), trying to connect at most
every `READ_RETRY_S` meanwhile.

Concurrent store and dispatch: a remove of a message whose add the writer has not taken yet
cancels both (nothing is written for either), unless the add carries an `x-dedup-id`, whose id
must reach the dedup window.

Paging reads metadata with a keyset query (`dest_id = $1 AND seq > $2 ORDER BY seq LIMIT n`),
picks what fits the byte budget, then reads those rows' bodies (and chunks). There is nothing to
collect or compact: a consumed message is a deleted row, and PostgreSQL's autovacuum reclaims it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from sortedcontainers import SortedDict

from sluice.config import DEFAULT_DEDUP_WINDOW
from sluice.errors import StoreError, StoreOfflineError
from sluice.store.api import (
    DEDUP_HEADER,
    CompletionSink,
    RecoveredSubscription,
    Recovery,
    StoreCapabilities,
    StoredMessage,
    StoreStats,
    StoreView,
    WriteHandle,
    WriteState,
    take_for_commit,
)
from sluice.store.postgres.batch import Op, OpKind, TxAdd, WriterState
from sluice.store.postgres.reads import MAX_SEQ, Shown, Snapshot, first_seq, read_page
from sluice.store.postgres.recovery import read_state, recover
from sluice.store.postgres.urls import safe_url
from sluice.store.postgres.writer import DatabaseFence, Reconnect, Writer, connection_lost

log = logging.getLogger(__name__)

DEFAULT_SCHEMA = "sluice"
CONNECT_TIMEOUT_S = 10
# A peer gone silent (a network cut, a host that died) is an error within about 10 s, not a wait
# for as long as TCP retries: keepalives for a connection waiting on an answer, and a bound on
# data sent and never acknowledged.
_LIVENESS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
# How long the store tries to connect again after losing its connection (`[store] reconnect_s`).
DEFAULT_RECONNECT_S = 30.0
# A read that found no connection tries to make one at most this often.
READ_RETRY_S = 0.25

T = TypeVar("T")


@dataclass
class _Tx:
    txno: int
    adds: list[TxAdd] = field(default_factory=list)
    removes: list[tuple[str, int]] = field(default_factory=list)


class PostgresStore:
    """The PostgreSQL store. `url` is a libpq connection string or URI; everything goes in the
    PostgreSQL schema `schema` (created if missing)."""

    capabilities = StoreCapabilities(pages_to_disk=True, durable=True, data_files=False)

    def __init__(
        self,
        url: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        dedup_window: int = DEFAULT_DEDUP_WINDOW,
        sync_acks: bool = False,
        fence: DatabaseFence | None = None,
        reconnect_s: float = DEFAULT_RECONNECT_S,
    ) -> None:
        self.url = url
        # After a lost connection, how long writes wait for a new one before the store fails.
        self.reconnect_s = reconnect_s
        # The high-availability lease every write batch is fenced by (`writer.DatabaseFence`).
        self.fence = fence
        # False: removes nobody waits for and cursor moves commit without waiting for the WAL
        # flush when a batch holds nothing else (`[store] sync_acks`, as with the journal).
        self.sync_acks = sync_acks
        self.schema = schema
        self.dedup_window = dedup_window
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._stats = StoreStats()
        self._writer: Writer | None = None
        self._reader: psycopg.Connection[Any] | None = None
        # When a read may next try to connect (after a failed attempt).
        self._read_retry_at = 0.0
        self._read_retry_reconnects = 0
        self._adds: dict[str, SortedDict] = {}
        self._removed: dict[str, dict[int, Op]] = {}
        # Per destination, the floors of range removes and deletes not yet committed, each with
        # its op; committed rows at or below the highest are hidden.
        self._floors: dict[str, list[tuple[int, Op]]] = {}
        self._txs: dict[str, _Tx] = {}
        self._row_ids = itertools.count(1)
        self._txnos = itertools.count(1)

    # -- lifecycle -------------------------------------------------------------------------------

    def _connect(self, *, autocommit: bool) -> psycopg.Connection[Any]:
        try:
            conn = psycopg.connect(
                self.url, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S, **_LIVENESS
            )
        except psycopg.Error as exc:
            raise StoreOfflineError(
                f"cannot connect to PostgreSQL at {safe_url(self.url)}: {exc}"
            ) from exc
        try:
            ident = sql.Identifier(self.schema)
            # The commit is the sync, whatever the server's default says.
            conn.execute("SET synchronous_commit TO on")
            conn.execute(sql.SQL("SET search_path TO {}").format(ident))
            if not autocommit:
                conn.commit()
        except BaseException:
            conn.close()
            raise
        return conn

    def _read_state(self, conn: psycopg.Connection[Any]) -> WriterState:
        state, _destinations = read_state(conn, self.dedup_window)
        return state

    def open(self, sink: CompletionSink) -> Recovery:
        """Migrate the schema, drop what unfinished transactions added, start the writer, and
        return what is stored."""
        if self._writer is not None:
            raise StoreError("store already open", safe_url(self.url))
        conn = self._connect(autocommit=False)
        try:
            recovery, state, max_row = recover(conn, self.schema, self.dedup_window)
            conn.commit()
            self._row_ids = itertools.count(max_row + 1)
            self._reader = self._connect(autocommit=True)
        except BaseException:
            conn.close()
            raise
        self._writer = Writer(
            conn=conn,
            state=state,
            lock=self._lock,
            stats=self._stats,
            sink=sink,
            on_written=self._written,
            on_failed=self._failed,
            lazy_acks=not self.sync_acks,
            fence=self.fence,
            reconnect=Reconnect(
                connect=lambda: self._connect(autocommit=False),
                read_state=self._read_state,
                timeout_s=self.reconnect_s,
            ),
        )
        self._writer.start()
        log.info(
            "postgres store open at %s (schema %s): %d destinations, %d subscriptions",
            safe_url(self.url),
            self.schema,
            len(recovery.destinations),
            len(recovery.subscriptions),
        )
        return recovery

    def close(self) -> None:
        """Write what is queued (and the durable cursors), then close both connections."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        stopped = writer.stop()
        self._release(writer, stopped)

    def abandon(self) -> None:
        """Drop the store as a crashed process would: what is queued is never written, and the
        connections close without committing anything more (tests of recovery)."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        writer.abandon()
        self._release(writer, stopped=True)

    def _release(self, writer: Writer, stopped: bool) -> None:
        if stopped:
            writer.conn.close()
        with self._read_lock:
            reader, self._reader = self._reader, None
            if reader is not None:
                reader.close()
        with self._lock:
            self._adds.clear()
            self._removed.clear()
            self._floors.clear()
        self._txs.clear()

    @property
    def _w(self) -> Writer:
        writer = self._writer
        if writer is None:
            raise StoreError("store is not open", safe_url(self.url))
        return writer

    # -- the overlay (`_lock` held) --------------------------------------------------------------

    def _written(self, ops: Sequence[Op]) -> None:
        """The writer committed these ops: their rows now show what the overlay showed."""
        for op in ops:
            self._forget(op)
            op.message = None

    def _failed(self, ops: Sequence[Op]) -> None:
        """These ops were not written: what they showed or hid goes."""
        for op in ops:
            self._forget(op)

    def _forget(self, op: Op) -> None:
        kind = op.kind
        if kind is OpKind.ADD and not op.txno:
            self._drop_add(op.destination, op.seq, op)
        elif kind is OpKind.REMOVE:
            removed = self._removed.get(op.destination)
            if removed is not None and removed.get(op.seq) is op:
                del removed[op.seq]
        elif kind in (OpKind.REMOVE_RANGE, OpKind.DEST_DELETE):
            floors = self._floors.get(op.destination)
            if floors is not None:
                floors[:] = [(seq, other) for seq, other in floors if other is not op]
                if not floors:
                    del self._floors[op.destination]
        elif kind is OpKind.COMMIT:
            for add, seq in op.commit_adds:
                self._drop_add(add.destination, seq, add.op)
            for destination, seq in op.commit_removes:
                removed = self._removed.get(destination)
                if removed is not None and removed.get(seq) is op:
                    del removed[seq]

    def _drop_add(self, destination: str, seq: int, op: Op) -> None:
        entries = self._adds.get(destination)
        if entries is None:
            return
        entry = entries.get(seq)
        if entry is not None and entry.op is op:
            del entries[seq]
            if not entries:
                del self._adds[destination]

    def _show(self, destination: str, entry: Shown) -> None:
        entries = self._adds.get(destination)
        if entries is None:
            entries = self._adds[destination] = SortedDict()
        entries[entry.seq] = entry
        removed = self._removed.get(destination)
        if removed is not None:
            removed.pop(entry.seq, None)

    def _set_floor(self, destination: str, seq: int, op: Op) -> None:
        self._floors.setdefault(destination, []).append((seq, op))
        entries = self._adds.get(destination)
        if entries is not None:
            for s in list(entries.irange(maximum=seq)):
                del entries[s]
        removed = self._removed.get(destination)
        if removed is not None:
            for s in [s for s in removed if s <= seq]:
                del removed[s]

    # -- messages --------------------------------------------------------------------------------

    def add(
        self,
        message: StoredMessage,
        on_complete: Callable[[WriteHandle], None] | None,
        txid: str | None = None,
    ) -> WriteHandle:
        """Queue the message's row; visible to `load` at once (at commit if transacted)."""
        writer = self._w
        size = message.size
        handle = WriteHandle(on_complete, size, self._lock)
        row_id = next(self._row_ids)
        op = Op(
            OpKind.ADD,
            handle,
            destination=message.destination,
            seq=message.seq,
            row_id=row_id,
            message=message,
            nbytes=size,
        )
        if txid is None:
            entry = Shown(message.seq, row_id, size, message.timestamp_ms, op)
            with self._lock:
                self._show(message.destination, entry)
                writer.submit(op)
            return handle
        tx = self._tx(txid)
        op.txno = tx.txno
        dedup_id = message.headers.get(DEDUP_HEADER, "")
        tx.adds.append(TxAdd(row_id, message.destination, size, message.timestamp_ms, dedup_id, op))
        with self._lock:
            writer.submit(op)
        return handle

    def remove(
        self,
        destination: str,
        seq: int,
        on_complete: Callable[[WriteHandle], None] | None = None,
        txid: str | None = None,
    ) -> WriteHandle:
        """Queue the row's delete, or cancel a still pending add together with this remove."""
        writer = self._w
        handle = WriteHandle(on_complete, 0, self._lock)
        if txid is not None:
            self._tx(txid).removes.append((destination, seq))
            with self._lock:
                writer.submit(Op(OpKind.NOTHING, handle))
            return handle
        op = Op(OpKind.REMOVE, handle, destination=destination, seq=seq)
        op.lazy = on_complete is None
        with self._lock:
            entries = self._adds.get(destination)
            entry = entries.get(seq) if entries is not None else None
            if entry is not None and _cancellable(entry.op):
                add_handle = entry.op.handle
                assert add_handle is not None
                add_handle.state = WriteState.CANCELLED
                handle.state = WriteState.CANCELLED
                self._drop_add(destination, seq, entry.op)
                self._stats.cancelled_writes += 1
                writer.submit(Op(OpKind.NOTHING, handle))
                return handle
            self._removed.setdefault(destination, {})[seq] = op
            writer.submit(op)
        return handle

    def remove_range(self, destination: str, upto_seq: int) -> WriteHandle:
        """Queue the delete of the rows up to `upto_seq`; hidden from `load` at once."""
        writer = self._w
        handle = WriteHandle(None, 0, self._lock)
        op = Op(OpKind.REMOVE_RANGE, handle, destination=destination, seq=upto_seq)
        with self._lock:
            self._set_floor(destination, upto_seq, op)
            writer.submit(op)
        return handle

    def _snapshot(self, destination: str, after_seq: int, want: int) -> Snapshot:
        """The overlay of a destination, enough of it for `want` messages after `after_seq`."""
        with self._lock:
            removed = set(self._removed.get(destination, ()))
            floor = max((seq for seq, _ in self._floors.get(destination, ())), default=0)
            entries = self._adds.get(destination)
            shown: list[Shown] = []
            if entries:
                keys = entries.irange(minimum=after_seq + 1)
                shown = [entries[s] for s in itertools.islice(keys, want + len(removed))]
        return Snapshot(shown, removed, floor)

    def _read(self, read: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run `read` on the read connection: once more on a new connection if the first was
        lost. A database error becomes a StoreError; no connection, a StoreOfflineError."""
        with self._read_lock:
            for attempt in range(2):
                conn = self._reader_conn()
                try:
                    return read(conn)
                except psycopg.Error as exc:
                    if not connection_lost(conn, exc):
                        raise StoreError(f"postgres read failed: {exc}") from exc
                    self._reader = None
                    conn.close()
                    if attempt:
                        raise StoreOfflineError(f"postgres read failed: {exc}") from exc
                    log.warning("postgres: the read connection was lost (%s)", exc)
        raise AssertionError("unreachable")

    def _reader_conn(self) -> psycopg.Connection[Any]:
        """The read connection, made again if it was lost (`_read_lock` held)."""
        if self._writer is None:
            raise StoreError("store is not open", safe_url(self.url))
        reader = self._reader
        if reader is not None:
            return reader
        now = time.monotonic()
        # Not while the writer finds the database unreachable (connecting here, on the caller's
        # thread, could wait for the connect timeout), nor again so soon after a failed attempt
        # unless the writer has connected since.
        stats = self._stats
        if stats.unavailable or (
            now < self._read_retry_at and stats.reconnects == self._read_retry_reconnects
        ):
            raise StoreOfflineError(
                f"postgres: no read connection to {safe_url(self.url)} (connecting again)"
            )
        try:
            reader = self._reader = self._connect(autocommit=True)
        except (StoreError, psycopg.Error, OSError) as exc:
            self._read_retry_at = now + READ_RETRY_S
            self._read_retry_reconnects = self._stats.reconnects
            raise StoreOfflineError(f"postgres: no read connection: {exc}") from exc
        return reader

    def load(
        self, destination: str, after_seq: int, max_count: int, max_bytes: int
    ) -> list[StoredMessage]:
        """Messages after `after_seq`, ascending, within the budgets (at least one): the
        overlay's snapshot first, then the database (see the module's docstring)."""
        snap = self._snapshot(destination, after_seq, max_count)
        return self._read(
            lambda conn: read_page(conn, destination, snap, after_seq, max_count, max_bytes)
        )

    def first_seq(self, destination: str, at_or_after_ms: int = 0) -> int:
        """Lowest stored sequence, or the first stamped at or after `at_or_after_ms` (0 if none)."""
        snap = self._snapshot(destination, 0, 1 << 30)
        return self._read(lambda conn: first_seq(conn, destination, snap, at_or_after_ms))

    # -- transactions ----------------------------------------------------------------------------

    def _tx(self, txid: str) -> _Tx:
        tx = self._txs.get(txid)
        if tx is None:
            tx = self._txs[txid] = _Tx(next(self._txnos))
        return tx

    def begin(self, txid: str) -> None:
        """Start a transaction; nothing is written before its first add."""
        self._tx(txid)

    def commit(
        self, txid: str, seqs: Sequence[int], on_complete: Callable[[WriteHandle], None] | None
    ) -> WriteHandle:
        """Queue the commit: the adds take these sequences, the removes apply; both show at once."""
        writer = self._w
        tx = take_for_commit(self._txs, txid, seqs)
        handle = WriteHandle(on_complete, 0, self._lock)
        if tx is None or not (tx.adds or tx.removes):
            handle.state = WriteState.WRITTEN
            with self._lock:
                writer.submit(Op(OpKind.NOTHING, handle))
            return handle
        op = Op(OpKind.COMMIT, handle, txno=tx.txno, commit_removes=list(tx.removes))
        with self._lock:
            for add, seq in zip(tx.adds, seqs, strict=True):
                add_handle = add.op.handle
                assert add_handle is not None
                if add_handle.state in (WriteState.CANCELLED, WriteState.FAILED):
                    continue
                op.commit_adds.append((add, seq))
                self._show(
                    add.destination, Shown(seq, add.row_id, add.size, add.timestamp_ms, add.op)
                )
            for destination, seq in tx.removes:
                self._removed.setdefault(destination, {})[seq] = op
            writer.submit(op)
        return handle

    def abort(self, txid: str) -> None:
        """Drop the transaction: adds not yet taken are never written, the rest are deleted."""
        writer = self._w
        tx = self._txs.pop(txid, None)
        if tx is None or not tx.adds:
            return
        with self._lock:
            for add in tx.adds:
                handle = add.op.handle
                if handle is not None and handle.state is WriteState.PENDING:
                    handle.state = WriteState.CANCELLED
            writer.submit(Op(OpKind.ABORT, None, txno=tx.txno))

    # -- destinations and subscriptions ----------------------------------------------------------

    def _submit(self, op: Op) -> WriteHandle:
        assert op.handle is not None
        with self._lock:
            self._w.submit(op)
        return op.handle

    def mark_dispatched(self, destination: str, seq: int) -> WriteHandle:
        """Queue the destination's dispatch mark (creating the destination)."""
        handle = WriteHandle(None, 0, self._lock)
        return self._submit(Op(OpKind.MARK, handle, destination=destination, seq=seq))

    def delete_destination(self, destination: str) -> WriteHandle:
        """Queue the delete of the destination's rows; hidden at once. Open transactions forget
        their removes of it."""
        writer = self._w
        handle = WriteHandle(None, 0, self._lock)
        op = Op(OpKind.DEST_DELETE, handle, destination=destination)
        for tx in self._txs.values():
            tx.removes = [(name, seq) for name, seq in tx.removes if name != destination]
        with self._lock:
            self._set_floor(destination, MAX_SEQ, op)
            writer.submit(op)
        return handle

    def put_subscription(self, sub: RecoveredSubscription) -> WriteHandle:
        """Queue the subscription's row (its cursor replaces any not yet written)."""
        with self._lock:
            self._w.cursors.pop((sub.client_id, sub.name), None)
        handle = WriteHandle(None, 0, self._lock)
        return self._submit(Op(OpKind.SUB_PUT, handle, subscription=replace(sub)))

    def delete_subscription(self, client_id: str, name: str) -> WriteHandle:
        """Queue the subscription's delete."""
        with self._lock:
            self._w.cursors.pop((client_id, name), None)
        sub = RecoveredSubscription(client_id, name, "", None, 0)
        return self._submit(
            Op(OpKind.SUB_DELETE, WriteHandle(None, 0, self._lock), subscription=sub)
        )

    def set_cursor(self, client_id: str, name: str, seq: int) -> None:
        """Coalesced: written with the next batch."""
        with self._lock:
            writer = self._w
            writer.cursors[(client_id, name)] = seq
            writer.cond.notify()

    # -- numbers ---------------------------------------------------------------------------------

    @property
    def writer_backend_pid(self) -> int:
        """The server process of the writer's connection (`pg_stat_activity.pid`)."""
        return int(self._w.conn.info.backend_pid)

    @property
    def reader_backend_pid(self) -> int:
        """The server process of the read connection (0 while there is none)."""
        reader = self._reader
        return 0 if reader is None or reader.closed else int(reader.info.backend_pid)

    def stats(self) -> StoreStats:
        """A snapshot of the store's numbers (no disk of its own: `disk_free_bytes` is -1)."""
        with self._lock:
            return replace(self._stats)

    def inspect(self, max_messages: int) -> StoreView:
        """No data files: the view names the store and holds none."""
        return StoreView("postgres", f"{safe_url(self.url)} schema {self.schema}")


def _cancellable(op: Op) -> bool:
    handle = op.handle
    return (
        handle is not None
        and handle.state is WriteState.PENDING
        and op.kind is OpKind.ADD
        and not op.txno
        and op.message is not None
        # An add with a dedup id is written anyway: its id must reach the persisted window.
        and not op.message.headers.get(DEDUP_HEADER)
    )
