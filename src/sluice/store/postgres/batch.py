"""The PostgreSQL store's ops as SQL: what a queued op is (`Op`), the state the writer keeps of
the database (`WriterState`), and one batch of ops turned into statements (`build`).

Consecutive statements of one kind go together (`Statements`): as one statement over arrays
when they have a bulk form (the rows' columns as arrays, `unnest`ed by the server), else as one
`executemany`. Building a batch advances the state as if it committed: new destinations get
their ids, last sequences move, dedup positions are handed out, the batch gets its number
(`writer_batch`). The writer reads the state back from the database when a batch it built did
not commit.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import psycopg

from sluice.store.api import (
    DEDUP_HEADER,
    RecoveredSubscription,
    StoredMessage,
    WriteHandle,
    WriteState,
)
from sluice.store.postgres.schema import CHUNK_BYTES, chunks_of, encode_headers


class OpKind(enum.Enum):
    """What a queued op does."""

    NOTHING = 0  # only a handle to complete
    ADD = 1
    REMOVE = 2
    REMOVE_RANGE = 3
    COMMIT = 4
    ABORT = 5
    MARK = 6
    DEST_DELETE = 7
    SUB_PUT = 8
    SUB_DELETE = 9


@dataclass(eq=False)
class TxAdd:
    """A transacted add, as its transaction remembers it until commit: its row, never its
    message once written."""

    row_id: int
    destination: str
    size: int
    timestamp_ms: int
    dedup_id: str
    op: Op


@dataclass(eq=False)
class Op:
    """One queued operation. `message` is held until the write commits (the overlay reads it
    meanwhile), then dropped."""

    kind: OpKind
    handle: WriteHandle | None
    destination: str = ""
    seq: int = 0
    row_id: int = 0
    txno: int = 0
    message: StoredMessage | None = None
    commit_adds: list[tuple[TxAdd, int]] = field(default_factory=list)
    commit_removes: list[tuple[str, int]] = field(default_factory=list)
    subscription: RecoveredSubscription | None = None
    nbytes: int = 0
    # A remove nobody waits for (an ack without a receipt): its batch alone need not be synced.
    lazy: bool = False


class Statements:
    """SQL statements in order. A run of one statement goes as one statement over arrays when
    it has a bulk form (`_BULK`: the rows' columns as arrays, `unnest`ed by the server: one
    execution for the run), or else as one `executemany`."""

    def __init__(self) -> None:
        self.groups: list[tuple[str, list[Sequence[Any]]]] = []

    def add(self, query: str, params: Sequence[Any]) -> None:
        if self.groups and self.groups[-1][0] is query:
            self.groups[-1][1].append(params)
        else:
            self.groups.append((query, [params]))

    def run(self, cur: psycopg.Cursor[Any]) -> None:
        for query, rows in self.groups:
            if len(rows) == 1:
                cur.execute(query, rows[0])
            elif query is _REMOVE:
                # By destination, so each delete is one scan of the (dest_id, seq) index.
                seqs: dict[int, list[int]] = {}
                for dest_id, seq in rows:
                    seqs.setdefault(dest_id, []).append(seq)
                for dest_id, dest_seqs in seqs.items():
                    cur.execute(_REMOVE_MANY, (dest_id, dest_seqs))
            elif query in _BULK:
                cur.execute(_BULK[query], [list(column) for column in zip(*rows, strict=True)])
            else:
                cur.executemany(query, rows)


_INSERT_DEST = "INSERT INTO destinations (id, name, live) VALUES (%s, %s, %s)"
_REVIVE_DEST = "UPDATE destinations SET live = true WHERE id = %s"
_INSERT_MSG = (
    "INSERT INTO messages (id, dest_id, seq, txno, message_id, timestamp_ms, expires_ms, "
    "priority, persistent, size, headers, body, chunks) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_INSERT_CHUNK = "INSERT INTO message_chunks (message, n, data) VALUES (%s, %s, %s)"
_INSERT_DEDUP = "INSERT INTO dedup_ids (dest_id, pos, dedup_id) VALUES (%s, %s, %s)"
_TRIM_DEDUP = "DELETE FROM dedup_ids WHERE dest_id = %s AND pos < %s"
# Deleting messages deletes their chunks in the same statement (the chunks of those that have
# any, found through the primary keys: never a scan of either table).
_REMOVE = (
    "WITH gone AS (DELETE FROM messages WHERE dest_id = %s AND seq = %s RETURNING id, chunks) "
    "DELETE FROM message_chunks WHERE message = ANY(ARRAY(SELECT id FROM gone WHERE chunks > 0))"
)
_REMOVE_MANY = (
    "WITH gone AS (DELETE FROM messages WHERE dest_id = %s AND seq = ANY(%s::bigint[]) "
    "RETURNING id, chunks) "
    "DELETE FROM message_chunks WHERE message = ANY(ARRAY(SELECT id FROM gone WHERE chunks > 0))"
)
_REMOVE_RANGE = (
    "WITH gone AS (DELETE FROM messages WHERE dest_id = %s AND seq <= %s RETURNING id, chunks) "
    "DELETE FROM message_chunks WHERE message = ANY(ARRAY(SELECT id FROM gone WHERE chunks > 0))"
)
_COMMIT_TX = (
    "UPDATE messages SET seq = v.seq, txno = NULL "
    "FROM unnest(%s::bigint[], %s::bigint[]) AS v (id, seq) WHERE messages.id = v.id"
)
_ABORT_TX = (
    "WITH gone AS (DELETE FROM messages WHERE txno = %s RETURNING id, chunks) "
    "DELETE FROM message_chunks WHERE message = ANY(ARRAY(SELECT id FROM gone WHERE chunks > 0))"
)
_MARK = "UPDATE destinations SET dispatch_mark = %s WHERE id = %s"
_LAST_SEQ = "UPDATE destinations SET last_seq = %s WHERE id = %s"
_DELETE_DEST_MSGS = (
    "WITH gone AS (DELETE FROM messages WHERE dest_id = %s AND seq IS NOT NULL "
    "RETURNING id, chunks) "
    "DELETE FROM message_chunks WHERE message = ANY(ARRAY(SELECT id FROM gone WHERE chunks > 0))"
)
_DELETE_DEST_DEDUP = "DELETE FROM dedup_ids WHERE dest_id = %s"
_DELETE_DEST = "UPDATE destinations SET live = false, last_seq = 0, dispatch_mark = 0 WHERE id = %s"
_SUB_PUT = (
    "INSERT INTO subscriptions (client_id, name, destination, selector, cursor) "
    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (client_id, name) DO UPDATE SET "
    "destination = excluded.destination, selector = excluded.selector, cursor = excluded.cursor"
)
_SUB_DELETE = "DELETE FROM subscriptions WHERE client_id = %s AND name = %s"
# Runs of these statements as one statement over arrays of their parameters.
_BULK = {
    _INSERT_MSG: (
        "INSERT INTO messages (id, dest_id, seq, txno, message_id, timestamp_ms, expires_ms, "
        "priority, persistent, size, headers, body, chunks) SELECT * FROM unnest("
        "%s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::text[], %s::bigint[], "
        "%s::bigint[], %s::smallint[], %s::boolean[], %s::bigint[], %s::bytea[], %s::bytea[], "
        "%s::integer[])"
    ),
    _INSERT_CHUNK: (
        "INSERT INTO message_chunks (message, n, data) "
        "SELECT * FROM unnest(%s::bigint[], %s::integer[], %s::bytea[])"
    ),
    _INSERT_DEDUP: (
        "INSERT INTO dedup_ids (dest_id, pos, dedup_id) "
        "SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::text[])"
    ),
}
_ASYNC_COMMIT = "SET LOCAL synchronous_commit TO off"
_SUB_CURSOR = "UPDATE subscriptions SET cursor = %s WHERE client_id = %s AND name = %s"
_BATCH = "UPDATE writer_batch SET batch = %s"


@dataclass
class WriterState:
    """What the database holds that the writer needs to write the next batch."""

    dest_ids: dict[str, int]
    live: set[str]
    last_seq: dict[str, int]
    next_dest_id: int
    next_dedup_pos: int
    # Each destination's dedup rows (positions, oldest first): at most a window kept.
    dedup_pos: dict[str, deque[int]]
    dedup_window: int
    # The number of the last batch committed (`writer_batch`).
    batch: int = 0


class Built(NamedTuple):
    """A batch as SQL: its statements, its number (0: it writes nothing), whether it commits
    without waiting for the WAL flush, and how many records it writes."""

    statements: Statements
    number: int
    lazy: bool
    records: int


def build(
    state: WriterState,
    batch: list[Op],
    cursors: dict[tuple[str, str], int],
    *,
    first: tuple[str, Sequence[Any]] | None,
    lazy_acks: bool,
) -> Built:
    """The batch's statements, `first` (the fence) first, advancing `state` as if they
    committed (the writer reads it back from the database if they do not)."""
    return _Sql(state).build(batch, cursors, first, lazy_acks)


class _Sql:
    """Turns ops into statements, keeping the writer's state in step."""

    def __init__(self, state: WriterState) -> None:
        self.state = state

    def build(
        self,
        batch: list[Op],
        cursors: dict[tuple[str, str], int],
        first: tuple[str, Sequence[Any]] | None,
        lazy_acks: bool,
    ) -> Built:
        statements = Statements()
        if first is not None:
            statements.add(*first)
        writes = [op for op in batch if op.kind is not OpKind.NOTHING]
        number = 0
        if writes or cursors:
            self.state.batch += 1
            number = self.state.batch
            statements.add(_BATCH, (number,))
        # Nobody waits for these to be durable: the commit does not wait for the WAL flush; the
        # next synchronous commit (or the WAL writer, within a fraction of a second) covers it.
        lazy = lazy_acks and bool(writes or cursors) and not any(map(_needs_sync, batch))
        if lazy:
            statements.add(_ASYNC_COMMIT, ())
        touched: set[str] = set()
        records = 0
        for op in batch:
            if op.handle is not None and op.handle.state is WriteState.CANCELLED:
                if op.kind is OpKind.ADD and not op.txno:
                    self._bump(op.destination, op.seq, statements)
                    touched.add(op.destination)
                continue
            if op.kind is not OpKind.NOTHING:
                self._statements(op, statements, touched)
                records += 1
        for (client_id, name), seq in cursors.items():
            statements.add(_SUB_CURSOR, (seq, client_id, name))
        for destination in touched:
            if destination in self.state.live:
                seq = self.state.last_seq.get(destination, 0)
                statements.add(_LAST_SEQ, (seq, self.state.dest_ids[destination]))
        return Built(statements, number, lazy, records)

    def _dest(self, destination: str, statements: Statements, *, live: bool = True) -> int:
        """The destination's row id, created (or made live again) in this batch if needed. A
        transacted add needs the row (`live=False`) but makes no destination before its
        commit."""
        state = self.state
        dest_id = state.dest_ids.get(destination)
        if dest_id is None:
            dest_id = state.dest_ids[destination] = state.next_dest_id
            state.next_dest_id += 1
            statements.add(_INSERT_DEST, (dest_id, destination, live))
            if live:
                state.live.add(destination)
        elif live and destination not in state.live:
            statements.add(_REVIVE_DEST, (dest_id,))
            state.live.add(destination)
        return dest_id

    def _bump(self, destination: str, seq: int, statements: Statements) -> None:
        """The destination's last sequence is at least `seq` (a row with it, or a write that
        leaves none, which then persists the number: see `touched` in `_process`)."""
        self._dest(destination, statements)
        if seq > self.state.last_seq.get(destination, 0):
            self.state.last_seq[destination] = seq

    def _dedup(self, destination: str, dedup_id: str, statements: Statements) -> None:
        state = self.state
        if not dedup_id or state.dedup_window <= 0:
            return
        dest_id = self._dest(destination, statements)
        pos = state.next_dedup_pos
        state.next_dedup_pos += 1
        statements.add(_INSERT_DEDUP, (dest_id, pos, dedup_id))
        window = state.dedup_pos.get(destination)
        if window is None:
            window = state.dedup_pos[destination] = deque()
        window.append(pos)
        if len(window) >= 2 * state.dedup_window:
            while len(window) > state.dedup_window:
                window.popleft()
            statements.add(_TRIM_DEDUP, (dest_id, window[0]))

    def _statements(self, op: Op, statements: Statements, touched: set[str]) -> None:
        """The SQL of one op. `touched`: destinations whose last sequence the batch must write,
        because it deletes rows (the highest sequence may go with them)."""
        state = self.state
        kind = op.kind
        if kind is OpKind.ADD:
            message = op.message
            assert message is not None
            dest_id = self._dest(op.destination, statements, live=not op.txno)
            body = message.body
            inline = len(body) <= CHUNK_BYTES
            statements.add(
                _INSERT_MSG,
                (
                    op.row_id,
                    dest_id,
                    None if op.txno else op.seq,
                    op.txno or None,
                    message.message_id,
                    message.timestamp_ms,
                    message.expires_ms,
                    message.priority,
                    message.persistent,
                    message.size,
                    encode_headers(message.headers),
                    bytes(body) if inline else None,
                    0 if inline else (len(body) + CHUNK_BYTES - 1) // CHUNK_BYTES,
                ),
            )
            if not inline:
                for n, chunk in enumerate(chunks_of(body)):
                    statements.add(_INSERT_CHUNK, (op.row_id, n, chunk))
            if not op.txno:
                self._bump(op.destination, op.seq, statements)
                self._dedup(op.destination, message.headers.get(DEDUP_HEADER, ""), statements)
        elif kind is OpKind.REMOVE:
            dest_id_or_none = state.dest_ids.get(op.destination)
            if dest_id_or_none is not None:
                statements.add(_REMOVE, (dest_id_or_none, op.seq))
                touched.add(op.destination)
        elif kind is OpKind.REMOVE_RANGE:
            dest_id = self._dest(op.destination, statements)
            statements.add(_REMOVE_RANGE, (dest_id, op.seq))
            touched.add(op.destination)
        elif kind is OpKind.COMMIT:
            ids, seqs = [], []
            for add, seq in op.commit_adds:
                ids.append(add.row_id)
                seqs.append(seq)
                self._bump(add.destination, seq, statements)
                self._dedup(add.destination, add.dedup_id, statements)
            if ids:
                statements.add(_COMMIT_TX, (ids, seqs))
            for destination, seq in op.commit_removes:
                dest_id_or_none = state.dest_ids.get(destination)
                if dest_id_or_none is not None:
                    statements.add(_REMOVE, (dest_id_or_none, seq))
                    touched.add(destination)
        elif kind is OpKind.ABORT:
            statements.add(_ABORT_TX, (op.txno,))
        elif kind is OpKind.MARK:
            dest_id = self._dest(op.destination, statements)
            statements.add(_MARK, (op.seq, dest_id))
        elif kind is OpKind.DEST_DELETE:
            dest_id_or_none = state.dest_ids.get(op.destination)
            if dest_id_or_none is not None and op.destination in state.live:
                statements.add(_DELETE_DEST_MSGS, (dest_id_or_none,))
                statements.add(_DELETE_DEST_DEDUP, (dest_id_or_none,))
                statements.add(_DELETE_DEST, (dest_id_or_none,))
                state.live.discard(op.destination)
                state.last_seq.pop(op.destination, None)
                state.dedup_pos.pop(op.destination, None)
                touched.discard(op.destination)
        elif kind is OpKind.SUB_PUT:
            sub = op.subscription
            assert sub is not None
            statements.add(
                _SUB_PUT, (sub.client_id, sub.name, sub.destination, sub.selector, sub.cursor)
            )
        elif kind is OpKind.SUB_DELETE:
            sub = op.subscription
            assert sub is not None
            statements.add(_SUB_DELETE, (sub.client_id, sub.name))


def _needs_sync(op: Op) -> bool:
    """Whether someone waits for this op to be durable: anything but a lazy remove, a handle
    completed before the batch (a cancelled add and its remove, an empty commit) or a
    handle-less op that writes nothing."""
    handle = op.handle
    if op.lazy or (handle is not None and handle.state is WriteState.CANCELLED):
        return False
    if op.kind is OpKind.NOTHING:
        return handle is not None and handle.state is WriteState.TAKEN
    return True
