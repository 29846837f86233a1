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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg import sql
from sortedcontainers import SortedDict

from sluice.config import DEFAULT_DEDUP_WINDOW
from sluice.errors import StoreError
from sluice.store.api import (
    DEDUP_HEADER,
    CompletionSink,
    RecoveredDestination,
    RecoveredSubscription,
    Recovery,
    StoreCapabilities,
    StoredMessage,
    StoreStats,
    StoreView,
    WriteHandle,
    WriteState,
)
from sluice.store.postgres.schema import decode_headers, migrate
from sluice.store.postgres.urls import safe_url
from sluice.store.postgres.writer import Op, OpKind, TxAdd, Writer, WriterState

log = logging.getLogger(__name__)

DEFAULT_SCHEMA = "sluice"
CONNECT_TIMEOUT_S = 10
_MAX_SEQ = (1 << 63) - 1
# Rows whose sizes a page reads per query while it fills its budget.
_META_ROWS = 512


@dataclass(eq=False)
class _Entry:
    """An add shown before it is committed: its message until written, then its row."""

    seq: int
    row_id: int
    size: int
    timestamp_ms: int
    op: Op


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
    ) -> None:
        self.url = url
        self.schema = schema
        self.dedup_window = dedup_window
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._stats = StoreStats()
        self._writer: Writer | None = None
        self._reader: psycopg.Connection[Any] | None = None
        self._adds: dict[str, SortedDict] = {}
        self._removed: dict[str, dict[int, Op]] = {}
        self._floors: dict[str, tuple[int, Op]] = {}
        self._txs: dict[str, _Tx] = {}
        self._row_ids = itertools.count(1)
        self._txnos = itertools.count(1)

    # -- lifecycle -------------------------------------------------------------------------------

    def _connect(self, *, autocommit: bool) -> psycopg.Connection[Any]:
        try:
            conn = psycopg.connect(
                self.url, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S
            )
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot connect to PostgreSQL at {safe_url(self.url)}: {exc}"
            ) from exc
        ident = sql.Identifier(self.schema)
        # The commit is the sync, whatever the server's default says.
        conn.execute("SET synchronous_commit TO on")
        conn.execute(sql.SQL("SET search_path TO {}").format(ident))
        if not autocommit:
            conn.commit()
        return conn

    def open(self, sink: CompletionSink) -> Recovery:
        """Migrate the schema, drop what unfinished transactions added, start the writer, and
        return what is stored."""
        if self._writer is not None:
            raise StoreError("store already open", safe_url(self.url))
        conn = self._connect(autocommit=False)
        try:
            recovery, state = self._recover(conn)
            conn.commit()
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

    def _recover(self, conn: psycopg.Connection[Any]) -> tuple[Recovery, WriterState]:
        report = migrate(conn, self.schema)
        dropped = conn.execute("DELETE FROM messages WHERE txno IS NOT NULL").rowcount
        if dropped:
            report.append(f"postgres: {dropped} messages of unfinished transactions dropped")
        rows = conn.execute(
            "SELECT id, name, live, last_seq, dispatch_mark FROM destinations"
        ).fetchall()
        counts = {
            dest_id: (count, size)
            for dest_id, count, size in conn.execute(
                "SELECT dest_id, count(*), coalesce(sum(size), 0) FROM messages "
                "WHERE seq IS NOT NULL GROUP BY dest_id"
            )
        }
        (max_row,) = conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone() or (0,)
        (max_pos,) = conn.execute("SELECT coalesce(max(pos), 0) FROM dedup_ids").fetchone() or (0,)
        self._row_ids = itertools.count(int(max_row) + 1)
        state = WriterState(
            dest_ids={},
            live=set(),
            last_seq={},
            next_dest_id=max((int(r[0]) for r in rows), default=0) + 1,
            next_dedup_pos=int(max_pos) + 1,
            dedup_pos={},
            dedup_window=self.dedup_window,
        )
        destinations = []
        for dest_id, name, live, last_seq, mark in rows:
            state.dest_ids[name] = dest_id
            if not live:
                continue
            state.live.add(name)
            state.last_seq[name] = last_seq
            window = self._dedup_window(conn, dest_id)
            state.dedup_pos[name] = deque(pos for pos, _ in window)
            count, size = counts.get(dest_id, (0, 0))
            destinations.append(
                RecoveredDestination(
                    name=name,
                    last_seq=int(last_seq),
                    message_count=int(count),
                    message_bytes=int(size),
                    dispatch_mark=int(mark),
                    dedup_ids=[dedup_id for _, dedup_id in window],
                )
            )
        subscriptions = [
            RecoveredSubscription(client_id, name, destination, selector, int(cursor))
            for client_id, name, destination, selector, cursor in conn.execute(
                "SELECT client_id, name, destination, selector, cursor FROM subscriptions"
            )
        ]
        return Recovery(destinations, subscriptions, report), state

    def _dedup_window(self, conn: psycopg.Connection[Any], dest_id: int) -> list[tuple[int, str]]:
        """The newest ids of a destination's window, oldest first; older rows are deleted."""
        if self.dedup_window <= 0:
            conn.execute("DELETE FROM dedup_ids WHERE dest_id = %s", (dest_id,))
            return []
        newest = conn.execute(
            "SELECT pos, dedup_id FROM dedup_ids WHERE dest_id = %s ORDER BY pos DESC LIMIT %s",
            (dest_id, self.dedup_window),
        ).fetchall()
        if newest:
            conn.execute(
                "DELETE FROM dedup_ids WHERE dest_id = %s AND pos < %s", (dest_id, newest[-1][0])
            )
        return [(int(pos), str(dedup_id)) for pos, dedup_id in reversed(newest)]

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
            floor = self._floors.get(op.destination)
            if floor is not None and floor[1] is op:
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

    def _show(self, destination: str, entry: _Entry) -> None:
        entries = self._adds.get(destination)
        if entries is None:
            entries = self._adds[destination] = SortedDict()
        entries[entry.seq] = entry
        removed = self._removed.get(destination)
        if removed is not None:
            removed.pop(entry.seq, None)

    def _set_floor(self, destination: str, seq: int, op: Op) -> None:
        self._floors[destination] = (seq, op)
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
            entry = _Entry(message.seq, row_id, size, message.timestamp_ms, op)
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

    def _snapshot(
        self, destination: str, after_seq: int, want: int
    ) -> tuple[list[_Entry], set[int], int]:
        """The overlay of a destination, enough of it for `want` messages after `after_seq`."""
        with self._lock:
            removed = set(self._removed.get(destination, ()))
            floor = self._floors.get(destination, (0, None))[0]
            entries = self._adds.get(destination)
            shown: list[_Entry] = []
            if entries:
                keys = entries.irange(minimum=after_seq + 1)
                shown = [entries[s] for s in itertools.islice(keys, want + len(removed))]
        return shown, removed, floor

    def load(
        self, destination: str, after_seq: int, max_count: int, max_bytes: int
    ) -> list[StoredMessage]:
        """Messages after `after_seq`, ascending, within the budgets (at least one)."""
        shown, removed, floor = self._snapshot(destination, after_seq, max_count)
        picked: list[tuple[int, int, _Entry | None]] = []  # (seq, row id, overlay entry)
        total = 0
        ov = 0
        with self._read_conn() as conn:
            cursor_seq = max(after_seq, floor)
            done = cursor_seq >= _MAX_SEQ
            rows: list[tuple[int, int, int]] = []
            ri = 0
            while len(picked) < max_count:
                if ri == len(rows) and not done:
                    rows = conn.execute(
                        "SELECT seq, size, id FROM messages WHERE dest_id = "
                        "(SELECT id FROM destinations WHERE name = %s) AND seq > %s "
                        "ORDER BY seq LIMIT %s",
                        (destination, cursor_seq, _META_ROWS),
                    ).fetchall()
                    ri = 0
                    done = len(rows) < _META_ROWS
                    if rows:
                        cursor_seq = rows[-1][0]
                next_db = rows[ri] if ri < len(rows) else None
                next_ov = shown[ov] if ov < len(shown) else None
                if next_db is None and next_ov is None:
                    break
                if next_ov is not None and (next_db is None or next_ov.seq <= next_db[0]):
                    ov += 1
                    if next_db is not None and next_db[0] == next_ov.seq:
                        ri += 1
                    seq, size, row_id, entry = next_ov.seq, next_ov.size, next_ov.row_id, next_ov
                else:
                    assert next_db is not None
                    ri += 1
                    seq, size, row_id = next_db
                    entry = None
                if seq in removed:
                    continue
                if picked and total + size > max_bytes:
                    break
                picked.append((seq, row_id, entry))
                total += size
            if not picked:
                return []
            return self._read_messages(conn, destination, picked)

    def _read_conn(self) -> _ReadConn:
        reader = self._reader
        if reader is None:
            raise StoreError("store is not open", safe_url(self.url))
        return _ReadConn(self._read_lock, reader)

    def _read_messages(
        self,
        conn: psycopg.Connection[Any],
        destination: str,
        picked: list[tuple[int, int, _Entry | None]],
    ) -> list[StoredMessage]:
        held: dict[int, StoredMessage] = {}
        fetch: list[int] = []
        for _seq, row_id, entry in picked:
            message = entry.op.message if entry is not None else None
            if message is not None:
                held[row_id] = message
            else:
                fetch.append(row_id)
        rows: dict[int, tuple[Any, ...]] = {}
        chunked: list[int] = []
        if fetch:
            for row in conn.execute(
                "SELECT id, message_id, timestamp_ms, expires_ms, priority, persistent, "
                "headers, body, chunks FROM messages WHERE id = ANY(%s)",
                (fetch,),
            ):
                rows[row[0]] = row
                if row[8]:
                    chunked.append(row[0])
        bodies: dict[int, list[bytes]] = {}
        if chunked:
            for row_id, data in conn.execute(
                "SELECT message, data FROM message_chunks WHERE message = ANY(%s) "
                "ORDER BY message, n",
                (chunked,),
            ):
                bodies.setdefault(row_id, []).append(data)
        out: list[StoredMessage] = []
        for seq, row_id, _entry in picked:
            message = held.get(row_id)
            if message is not None:
                out.append(_copy(message, seq))
                continue
            row = rows.get(row_id)
            if row is None:
                continue  # removed since the page was picked
            _, message_id, ts, expires, priority, persistent, headers, body, chunks = row
            if chunks:
                parts = bodies.get(row_id, [])
                if len(parts) != chunks:
                    raise StoreError(
                        f"message {seq} of {destination}: {len(parts)} of {chunks} chunks stored"
                    )
                body = b"".join(parts)
            out.append(
                StoredMessage(
                    destination,
                    seq,
                    message_id,
                    ts,
                    decode_headers(headers, f"message {seq} of {destination}"),
                    bytes(body),
                    expires_ms=expires,
                    priority=priority,
                    persistent=persistent,
                )
            )
        return out

    def first_seq(self, destination: str, at_or_after_ms: int = 0) -> int:
        """Lowest stored sequence, or the first stamped at or after `at_or_after_ms` (0 if none)."""
        shown, removed, floor = self._snapshot(destination, 0, 1 << 30)
        best = 0
        for entry in shown:
            if entry.seq not in removed and entry.timestamp_ms >= at_or_after_ms:
                best = entry.seq
                break
        with self._read_conn() as conn:
            row = conn.execute(
                "SELECT seq FROM messages WHERE dest_id = "
                "(SELECT id FROM destinations WHERE name = %s) AND seq > %s "
                "AND timestamp_ms >= %s AND seq <> ALL(%s) AND (%s = 0 OR seq < %s) "
                "ORDER BY seq LIMIT 1",
                (destination, floor, at_or_after_ms, sorted(removed), best, best),
            ).fetchone()
        return int(row[0]) if row is not None else best

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
        tx = self._txs.get(txid)
        adds = len(tx.adds) if tx is not None else 0
        if len(seqs) != adds:
            raise ValueError(f"commit of {txid}: {len(seqs)} sequences for {adds} adds")
        self._txs.pop(txid, None)
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
                    add.destination, _Entry(seq, add.row_id, add.size, add.timestamp_ms, add.op)
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
            self._set_floor(destination, _MAX_SEQ, op)
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

    def stats(self) -> StoreStats:
        """A snapshot of the store's numbers (no disk of its own: `disk_free_bytes` is -1)."""
        with self._lock:
            return replace(self._stats)

    def inspect(self, max_messages: int) -> StoreView:
        """No data files: the view names the store and holds none."""
        return StoreView("postgres", f"{safe_url(self.url)} schema {self.schema}")


class _ReadConn:
    """The read connection, held for one read; a database error becomes a StoreError."""

    def __init__(self, lock: threading.Lock, conn: psycopg.Connection[Any]) -> None:
        self._lock = lock
        self._conn = conn

    def __enter__(self) -> psycopg.Connection[Any]:
        self._lock.acquire()
        return self._conn

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self._lock.release()
        if isinstance(exc, psycopg.Error):
            raise StoreError(f"postgres read failed: {exc}") from exc


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


def _copy(message: StoredMessage, seq: int) -> StoredMessage:
    """A stored message as a read hands it out: its own object, as one read from the database."""
    return StoredMessage(
        message.destination,
        seq,
        message.message_id,
        message.timestamp_ms,
        dict(message.headers),
        message.body,
        expires_ms=message.expires_ms,
        priority=message.priority,
        persistent=message.persistent,
    )
