"""The PostgreSQL store's group-commit writer: one transaction per batch, a batch at a time on
each of its connections (`lanes.Lane`, two by default), kept in order by the database.

Each lane's thread, in turn, takes everything queued (up to `MAX_BATCH_OPS`) under the store
lock, marking the handles TAKEN so they can no longer be cancelled, turns the ops into SQL
statements (consecutive statements of one kind go as one `executemany`, pipelined), and COMMITs:
the commit is the sync (the connections run with `synchronous_commit = on`). One lane builds at
a time, so batches are numbered in the order they were taken; a lane takes the next batch while
the other's commits only if someone waits for something queued (a batch of lazy removes alone
rather joins the next one). Batches are completed in their order, whichever lane committed them:
the handles marked WRITTEN, what the store's overlay held for them dropped, all of them handed to
the completion sink in one call.

The order in the database: every batch that writes starts with `writer_chain(n - 1, n)`
(`schema.py`), which waits until batch n - 1 committed and moves `writer_batch` on to n, so
every later statement of batch n sees what batch n - 1 wrote (a remove of a message it added, a
commit of a transaction's adds, a destination it deleted); if batch n - 1 can no longer commit,
the chain refuses batch n. No dependency between batches is tracked here.

What the writer keeps between batches (destination ids, each destination's last sequence, the
dedup windows' row positions, the number of its last batch) mirrors the database as of the last
batch built, which is committed once every batch before it is.

Failures are dealt with by a thread of their own (`_mend`) once the oldest batch in flight
failed; nothing is built or completed meanwhile. A lost connection (the server restarted, a
network cut) is not a failure: the writer holds the batches in flight (cancelling one that
waits on the chain for the lost one) and everything queued behind them (the broker's
pending-write limits then pause producers), connects again with backoff for up to `reconnect_s`,
and learns which batches committed from `writer_batch`. Those are done; the writer reads its
state back from the database and writes the others again, in order, one at a time. Any other
database error, or no connection within `reconnect_s`, fails the store, as a failed sync fails
the journal: the batches' handles and every later write fail, and a restart reopens from what
the database committed.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
import psycopg.errors

from sluice.errors import FencedError, StoreError
from sluice.store.api import (
    DEDUP_HEADER,
    CompletionSink,
    RecoveredSubscription,
    StoredMessage,
    StoreStats,
    WriteHandle,
    WriteState,
)
from sluice.store.postgres.lanes import Flight, Lane
from sluice.store.postgres.schema import CHUNK_BYTES, chunks_of, encode_headers

log = logging.getLogger(__name__)

MAX_BATCH_OPS = 4096
# A batch stops growing past this many bytes of messages (it holds at least one op).
MAX_BATCH_BYTES = 16 * 1024 * 1024
STOP_TIMEOUT_S = 10.0
# Waits between attempts to connect again: doubling from the first to the last.
RECONNECT_FIRST_S = 0.05
RECONNECT_MAX_S = 1.0
# While failed batches are waited for, a batch still running is asked to stop this often.
CANCEL_EVERY_S = 0.5


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


class _Statements:
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
# Every batch that writes starts with it (its number after the last batch's, `schema.py`).
_CHAIN = "SELECT writer_chain(%s, %s)"
_LAST_BATCH = "SELECT batch FROM writer_batch"


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


@dataclass(frozen=True)
class Reconnect:
    """How the writer connects again after losing its connection: `connect` makes a connection
    set up as the store's, `read_state` reads the writer's state back in its transaction, and
    `timeout_s` bounds the attempts (0: a lost connection fails the store at once)."""

    connect: Callable[[], psycopg.Connection[Any]]
    read_state: Callable[[psycopg.Connection[Any]], WriterState]
    timeout_s: float


class DatabaseFence(Protocol):
    """The high-availability lease as the writer uses it (`sluice.ha.PgLease`): checked on this
    process's clock before each batch, and in the database by `statement()`, run in every
    batch's transaction right after the chain step (once the batch before has committed),
    which raises an error holding `message` unless the lease is still this process's.
    `lost(reason)` is told when the database refused a batch so."""

    message: str

    def check(self) -> None:
        """Raise `FencedError` unless the lease is held and valid now."""
        ...

    def statement(self) -> tuple[str, Sequence[Any]]:
        """The fencing statement and its parameters."""
        ...

    def lost(self, reason: str) -> None:
        """The lease is lost: stop serving."""
        ...


class Writer:
    """Owns the write connections (one `Lane` each, with its thread) once started, and a thread
    that deals with failures."""

    def __init__(
        self,
        *,
        conns: Sequence[psycopg.Connection[Any]],
        state: WriterState,
        lock: threading.Lock,
        stats: StoreStats,
        sink: CompletionSink,
        on_written: Callable[[Sequence[Op]], None],
        on_failed: Callable[[Sequence[Op]], None],
        lazy_acks: bool = True,
        fence: DatabaseFence | None = None,
        reconnect: Reconnect | None = None,
    ) -> None:
        self.fence = fence
        self.reconnect = reconnect
        # Batches of lazy removes and cursor moves alone commit without waiting for the flush.
        self.lazy_acks = lazy_acks
        self.state = state
        self.lock = lock
        self.stats = stats
        self.sink = sink
        self.queue: deque[Op] = deque()
        # How many queued ops someone may wait for (not `lazy`).
        self._waited = 0
        self.cursors: dict[tuple[str, str], int] = {}
        self.failed: BaseException | None = None
        self._on_written = on_written
        self._on_failed = on_failed
        self._closing = False
        self._abandoned = False
        self.lanes = [Lane(n, conn, lock) for n, conn in enumerate(conns)]
        # Built batches in order, oldest first, until completed.
        self._flights: deque[Flight] = deque()
        # A lane is taking and building a batch (one at a time: the order of the batches).
        self._building = False
        # A thread is completing the batches done, in order.
        self._delivering = False
        # The oldest batch failed: nothing more is built or completed until `_mend` is done.
        self._trouble = False
        # Everything is written (or the store dropped): the lanes end.
        self._finished = False
        # Batches to write again after a lost connection (before anything queued), one at a time.
        self._redo: deque[tuple[list[Op], dict[tuple[str, str], int]]] = deque()
        # Wakes the thread that deals with failures (`_mend`), and waits for lanes meanwhile.
        self._mending = threading.Condition(lock)
        self._thread = threading.Thread(target=self._run, name="sluice-postgres", daemon=True)
        for lane in self.lanes:
            lane.thread = threading.Thread(
                target=self._lane_run,
                args=(lane,),
                name=f"sluice-postgres-{lane.index}",
                daemon=True,
            )

    @property
    def conn(self) -> psycopg.Connection[Any]:
        """The first lane's connection: the one a batch goes to when nothing else runs."""
        conn = self.lanes[0].conn
        assert conn is not None
        return conn

    # -- called by the store ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the threads."""
        for lane in self.lanes:
            assert lane.thread is not None
            lane.thread.start()
        self._thread.start()

    def submit(self, op: Op) -> None:
        """Queue an op. The caller holds `lock`."""
        self.queue.append(op)
        self.stats.pending_writes += 1
        self.stats.pending_write_bytes += op.nbytes
        if not op.lazy:
            self._waited += 1
        self.wake()

    def wake(self) -> None:
        """Something was queued: wake a lane that sleeps and may take it, the first first (a
        batch goes to the first lane when nothing else runs). The caller holds `lock`."""
        for lane in self.lanes:
            if lane.waiting and self._may_build(lane):
                lane.cond.notify()
                return

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Write what is queued and end the threads; False if they did not end in time."""
        self._end(abandon=False)
        return self._join(timeout_s)

    def abandon(self) -> None:
        """End the threads after the batches in progress, writing nothing more (a crash)."""
        self._end(abandon=True)
        self._join(STOP_TIMEOUT_S)

    def close_connections(self) -> None:
        """Close every connection (the threads have ended)."""
        for lane in self.lanes:
            with contextlib.suppress(psycopg.Error, OSError):
                lane.close()

    def _end(self, *, abandon: bool) -> None:
        with self.lock:
            self._closing = True
            self._abandoned = self._abandoned or abandon
            self._wake_all()

    def _join(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for thread in [self._thread, *(lane.thread for lane in self.lanes)]:
            assert thread is not None
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.error("the postgres writer did not stop within %.0f s; leaving it", timeout_s)
                return False
        return True

    def _wake_all(self) -> None:
        for lane in self.lanes:
            lane.cond.notify()
        self._mending.notify()

    # -- the lanes -------------------------------------------------------------------------------

    def _lane_run(self, lane: Lane) -> None:
        try:
            self._lane_loop(lane)
        except BaseException as exc:  # the thread's boundary: fail loudly, never silently stop
            log.exception("postgres writer failed")
            self._set_failed(exc)
            with self.lock:
                job, lane.job = lane.job, None
                if job is not None:
                    job.error, job.done = exc, True
                self._building = False
                self._trouble = True
                self._wake_all()

    def _lane_loop(self, lane: Lane) -> None:
        """Turn after turn: take and build the next batch (one lane at a time, so the batches
        are numbered in order), run it, and complete what is done, in order. Batch n + 1 is
        built and sent on one lane while batch n commits on the other."""
        while True:
            with self.lock:
                while not (self._finished or self._may_build(lane)):
                    lane.waiting = True
                    lane.cond.wait()
                    lane.waiting = False
                if self._finished:
                    return
                self._building = True
                if self._redo:
                    batch, cursors = self._redo.popleft()
                else:
                    batch = self._take()
                    cursors, self.cursors = self.cursors, {}
            flight = self._build_flight(batch, cursors)
            with self.lock:
                self._building = False
                self._tell_mender()
                self._flights.append(flight)
                if not flight.done:
                    flight.lane = lane
                    lane.job = flight
                self.wake()  # the other lane may take the rest while this one commits
            if not flight.done:
                error = lane.commit(flight)
                with self.lock:
                    flight.error = error
                    flight.done = True
                    lane.job = None
                    self._tell_mender()
            self._complete_done()

    def _idle(self) -> bool:
        return not (self.queue or self.cursors or self._redo)

    def _may_build(self, lane: Lane) -> bool:
        """Whether `lane` may take the next batch now. The caller holds the lock."""
        if self._abandoned or self._building or self._trouble or self._idle():
            return False
        if self.failed is not None:
            return True  # it fails in turn
        if self._redo and self._flights:
            return False  # batches written again go one at a time
        if not self._waited and any(other.job is not None for other in self.lanes):
            # Nobody waits for what is queued: it joins the next batch rather than making a
            # small one of its own (each batch is a commit).
            return False
        return lane.conn is not None

    def _take(self) -> list[Op]:
        batch: list[Op] = []
        nbytes = 0
        queue = self.queue
        while queue and len(batch) < MAX_BATCH_OPS and (not batch or nbytes < MAX_BATCH_BYTES):
            op = queue.popleft()
            batch.append(op)
            nbytes += op.nbytes
            handle = op.handle
            if handle is not None and handle.state is WriteState.PENDING:
                handle.state = WriteState.TAKEN
            if not op.lazy:
                self._waited -= 1
        self.stats.pending_writes -= len(batch)
        self.stats.pending_write_bytes -= nbytes
        return batch

    def _build_flight(self, batch: list[Op], cursors: dict[tuple[str, str], int]) -> Flight:
        handles = [op.handle for op in batch if op.handle is not None]
        flight = Flight(batch, cursors, handles)
        if self.failed is not None:
            flight.error, flight.fatal, flight.done = self.failed, True, True
            return flight
        try:
            flight.statements, flight.number, flight.lazy, flight.records = self._build(
                batch, cursors
            )
        except FencedError as exc:
            self._set_failed(exc)
            flight.error, flight.fatal, flight.done = exc, True, True
        return flight

    def _complete_done(self) -> None:
        """Complete the oldest batches that are done, in order, unless another thread does;
        a failed one is left to `_mend`."""
        with self.lock:
            if self._delivering:
                return  # that thread completes this batch too once it is the oldest
            self._delivering = True
        while True:
            with self.lock:
                head = self._flights[0] if self._flights else None
                if self._trouble or head is None or not head.done:
                    head = None
                elif head.error is not None:
                    self._trouble = True
                    head = None
                else:
                    self._flights.popleft()
                if head is None:
                    self._delivering = False
                    self._tell_mender()
                    return
            self._written(head)

    def _tell_mender(self) -> None:
        """Wake `_mend_loop` if it has something to see (not after every batch: each wake is a
        thread switch). The caller holds the lock."""
        if self._trouble or self._closing:
            self._mending.notify()

    def _written(self, flight: Flight) -> None:
        with self.lock:
            for handle in flight.handles:
                if handle.state is WriteState.TAKEN:
                    handle.state = WriteState.WRITTEN
            self.stats.written_records += flight.records + len(flight.cursors)
            self.stats.batches += 1
            self.stats.syncs += 0 if flight.lazy else 1
            self._on_written(flight.batch)
        self._deliver(flight.handles)

    # -- failures --------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._mend_loop()
        except BaseException as exc:  # the thread's boundary: fail loudly, never silently stop
            log.exception("postgres writer failed")
            self._set_failed(exc)
            for flight in self._drain():
                self._fail(flight, exc)
        with self.lock:
            self._finished = True
            self._wake_all()

    def _mend_loop(self) -> None:
        """Wait for the oldest batch to fail, and deal with it; end once everything queued is
        written after `stop` (or the batches in flight are done after `abandon`)."""
        while True:
            with self.lock:
                while not self._trouble:
                    if (
                        self._closing
                        and not (self._flights or self._building or self._delivering)
                        and (self._abandoned or self._idle())
                    ):
                        return
                    self._mending.wait()
            self._mend()
            with self.lock:
                self._trouble = False
                self._wake_all()

    def _mend(self) -> None:
        """The oldest batch failed: every batch in flight is waited for (none completes before
        it), then either the connection is made again and what did not commit is written again,
        or the store fails with all of them."""
        flights = self._drain()
        if not flights:
            return  # a lane's thread failed: `failed` is set, the next batches fail in turn
        head = flights[0]
        assert head.error is not None
        error = head.error if head.fatal else self._refused(head)
        if error is None:
            self._ride_through(flights)
            return
        if not head.fatal:
            log.error(
                "postgres: a batch of %d writes failed; the store stops: %s",
                len(head.batch),
                head.error,
            )
        self._set_failed(error)
        # No later batch commits without this one (the chain): they fail with it, in order.
        for flight in flights:
            self._fail(flight, error)

    def _drain(self) -> list[Flight]:
        """Wait until every batch in flight is done, cancelling what still runs (batches waiting
        on the chain for one that failed; again every `CANCEL_EVERY_S`, for a cancel that came
        before the statement), and take them all, in order."""
        while True:
            with self.lock:
                while self._building:
                    self._mending.wait()
                running = [f.lane for f in self._flights if not f.done and f.lane is not None]
                if not running:
                    flights = list(self._flights)
                    self._flights.clear()
                    return flights
            for lane in running:  # a request to the server: not under the store's lock
                lane.cancel()
            with self.lock:
                if any(not f.done for f in self._flights):
                    self._mending.wait(CANCEL_EVERY_S)

    def _build(
        self, batch: list[Op], cursors: dict[tuple[str, str], int]
    ) -> tuple[_Statements, int, bool, int]:
        """The batch's statements, its number (0: it writes nothing), whether it commits
        without waiting for the flush, and how many records it writes. Raises FencedError when
        this process no longer holds the lease."""
        statements = _Statements()
        fence = self.fence
        if fence is not None:
            fence.check()
        writes = [op for op in batch if op.kind is not OpKind.NOTHING]
        number = 0
        if writes or cursors:
            # First: it waits for the batch before to commit (see `writer_chain`).
            number = self.state.batch + 1
            statements.add(_CHAIN, (self.state.batch, number))
            self.state.batch = number
        if fence is not None:
            statements.add(*fence.statement())
        # Nobody waits for these to be durable: the commit does not wait for the WAL flush; the
        # next synchronous commit (or the WAL writer, within a fraction of a second) covers it.
        lazy = self.lazy_acks and bool(writes or cursors) and not any(map(_needs_sync, batch))
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
        return statements, number, lazy, records

    def _refused(self, flight: Flight) -> BaseException | None:
        """What a failed batch fails with, or None when its connection was lost and may be made
        again."""
        exc = flight.error
        assert exc is not None
        assert flight.lane is not None
        fence = self.fence
        if fence is not None and fence.message in str(exc):
            fence.lost("the database refused a batch for want of the lease")
            return FencedError("the database refused a batch: this broker lost its lease")
        reconnect = self.reconnect
        conn = flight.lane.conn
        if (
            reconnect is None
            or reconnect.timeout_s <= 0
            or conn is None
            or not connection_lost(conn, exc)
        ):
            return exc
        return None

    # -- a lost connection -----------------------------------------------------------------------

    def _ride_through(self, flights: list[Flight]) -> None:
        """The oldest batch of `flights` (all done) lost its connection: connect again, complete
        the batches that committed, and write the others again, in order, one at a time, from
        the state read back from the database."""
        head = flights[0]
        assert head.error is not None
        numbers = [flight.number for flight in flights]
        try:
            last = self._connect_again(head.error, max(numbers))
        except (StoreError, FencedError) as gave_up:
            log.error(
                "postgres: a batch of %d writes failed; the store stops: %s",
                len(head.batch),
                gave_up,
            )
            self._set_failed(gave_up)
            for flight in flights:
                self._fail(flight, gave_up)
            return
        # Batch n + 1 commits only after batch n: those that landed come first.
        landed = 0
        while landed < len(flights) and (numbers[landed] == 0 or numbers[landed] <= last):
            landed += 1
        log.warning(
            "postgres: the writer is connected again; %s",
            "the batch in flight had committed"
            if landed == len(flights) == 1
            else "the batch in flight is written again"
            if len(flights) == 1
            else f"of {len(flights)} batches in flight {landed} had committed, the others are "
            "written again",
        )
        for flight in flights[:landed]:
            self._written(flight)
        with self.lock:
            self._redo.extendleft(
                (flight.batch, flight.cursors) for flight in reversed(flights[landed:])
            )

    def _connect_again(self, lost: BaseException, number: int) -> int:
        """Connect every lane again (batches up to `number` were in flight, 0 if none writes
        anything): the number of the last batch committed. The state is read back from the
        database when that is not `number`. Raises StoreError when no connection came within
        `reconnect_s`, or the store is being dropped, and FencedError when the lease was lost
        meanwhile."""
        reconnect = self.reconnect
        assert reconnect is not None
        log.warning(
            "postgres: the writer lost its connection (%s); connecting again for up to %.0f s, "
            "writes wait",
            str(lost).strip() or type(lost).__name__,
            reconnect.timeout_s,
        )
        with self.lock:
            self.stats.unavailable = True
            for lane in self.lanes:
                lane.replace(None)
        started = time.monotonic()
        deadline = started + reconnect.timeout_s
        last = -1
        for lane in self.lanes:
            delay = RECONNECT_FIRST_S
            conn: psycopg.Connection[Any] | None = None
            while True:
                if self.fence is not None:
                    self.fence.check()
                try:
                    conn = reconnect.connect()
                except (StoreError, psycopg.Error, OSError) as exc:
                    error: BaseException = exc
                else:
                    try:
                        if last < 0:
                            last = self._learn(conn, number, reconnect)
                    except (psycopg.Error, OSError) as exc:
                        conn.close()
                        error = exc
                    else:
                        break
                with self.lock:
                    if self._abandoned:
                        raise StoreError("postgres: the store was dropped while connecting again")
                    if self._closing:  # the broker stops: try a little longer, not for ever
                        deadline = min(deadline, time.monotonic() + STOP_TIMEOUT_S / 2)
                    if time.monotonic() + delay > deadline:
                        if last < 0:
                            raise StoreError(
                                "postgres: no connection within reconnect_s = "
                                f"{reconnect.timeout_s:g} s: {error}"
                            )
                        log.warning("postgres: the writer goes on with fewer connections")
                        conn = None
                        break
                    self._mending.wait(delay)
                delay = min(2 * delay, RECONNECT_MAX_S)
            with self.lock:
                lane.replace(conn)
        with self.lock:
            self.stats.unavailable = False
            self.stats.reconnects += 1
        log.warning(
            "postgres: the writer is connected again after %.1f s", time.monotonic() - started
        )
        return last

    def _learn(self, conn: psycopg.Connection[Any], number: int, reconnect: Reconnect) -> int:
        """On a new connection: the number of the last batch committed. If batch `number` did
        not commit, the writer's state becomes the database's."""
        row = conn.execute(_LAST_BATCH).fetchone()
        last = int(row[0]) if row is not None else 0
        if number != 0 and last < number:
            self.state = reconnect.read_state(conn)
        conn.commit()
        return last

    # -- ops into SQL ----------------------------------------------------------------------------

    def _dest(self, destination: str, statements: _Statements, *, live: bool = True) -> int:
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

    def _bump(self, destination: str, seq: int, statements: _Statements) -> None:
        """The destination's last sequence is at least `seq` (a row with it, or a write that
        leaves none, which then persists the number: see `touched` in `_process`)."""
        self._dest(destination, statements)
        if seq > self.state.last_seq.get(destination, 0):
            self.state.last_seq[destination] = seq

    def _dedup(self, destination: str, dedup_id: str, statements: _Statements) -> None:
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

    def _statements(self, op: Op, statements: _Statements, touched: set[str]) -> None:
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

    # -- completion and failure ------------------------------------------------------------------

    def _deliver(self, handles: list[WriteHandle]) -> None:
        if not handles:
            return
        try:
            self.sink(handles)
        except Exception:  # the sink is the core's; its failure must not stop the writer
            log.exception("completion sink raised")

    def _set_failed(self, exc: BaseException) -> None:
        with self.lock:
            if self.failed is None:
                self.failed = exc
                self.stats.write_errors += 1

    def _fail(self, flight: Flight, exc: BaseException) -> None:
        error = exc if isinstance(exc, StoreError) else StoreError(f"postgres write failed: {exc}")
        with self.lock:
            for handle in flight.handles:
                if not handle.done:
                    handle.state = WriteState.FAILED
                    handle.error = error
            self._on_failed(flight.batch)
        self._deliver(flight.handles)


# The server ended the session (a shutdown, a crash of another backend, pg_terminate_backend,
# an idle timeout, a recovery under way) or the connection failed: a new one may do.
_SESSION_ENDED = (
    psycopg.errors.AdminShutdown,
    psycopg.errors.CrashShutdown,
    psycopg.errors.CannotConnectNow,
    psycopg.errors.IdleSessionTimeout,
    psycopg.errors.ConnectionException,
)


def connection_lost(conn: psycopg.Connection[Any], exc: BaseException) -> bool:
    """Whether `exc`, raised by a statement on `conn`, means the connection is gone (the error
    may come before the socket's end is seen, so both are asked)."""
    return conn.broken or conn.closed or isinstance(exc, _SESSION_ENDED)


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
