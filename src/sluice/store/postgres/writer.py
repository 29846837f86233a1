"""The PostgreSQL store's group-commit writer: one thread, one connection, one transaction per
batch.

Each turn it takes everything queued (up to `MAX_BATCH_OPS`) under the store lock, marking the
handles TAKEN so they can no longer be cancelled, turns the ops into SQL statements
(`batch.build`), sends them in one pipelined round trip, and COMMITs: the commit is the sync
(the connection runs with `synchronous_commit = on`). Then it marks the handles WRITTEN, drops
what the store's overlay held for them, and hands them all to the completion sink in one call.

What the writer keeps between batches (destination ids, each destination's last sequence, the
dedup windows' row positions, the number of its last batch) mirrors the database as of its last
commit.

A lost connection (the server restarted, a network cut) is not a failure: the writer holds the
batch and everything queued behind it (the broker's pending-write limits then pause producers),
connects again with backoff for up to `reconnect_s`, and learns whether the COMMIT in flight
took effect from `writer_batch`, which every batch sets to its own number. If it did, the batch is
done; if not, the writer reads its state back from the database and writes the batch again. Any
other database error, or no connection within `reconnect_s`, fails the store, as a failed sync
fails the journal: the batch's handles and every later write fail, and a restart reopens from
what the database committed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
import psycopg.errors

from sluice.errors import FencedError, StoreError
from sluice.store.api import CompletionSink, StoreStats, WriteHandle, WriteState
from sluice.store.postgres.batch import Built, Op, WriterState, build

log = logging.getLogger(__name__)

MAX_BATCH_OPS = 4096
# A batch stops growing past this many bytes of messages (it holds at least one op).
MAX_BATCH_BYTES = 16 * 1024 * 1024
STOP_TIMEOUT_S = 10.0
# Waits between attempts to connect again: doubling from the first to the last.
RECONNECT_FIRST_S = 0.05
RECONNECT_MAX_S = 1.0


_LAST_BATCH = "SELECT batch FROM writer_batch"


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
    process's clock before each batch, and in the database by `statement()`, run first in every
    batch's transaction, which raises an error holding `message` unless the lease is still this
    process's. `lost(reason)` is told when the database refused a batch so."""

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
    """Owns the write connection once started."""

    def __init__(
        self,
        *,
        conn: psycopg.Connection[Any],
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
        self.conn = conn
        self.fence = fence
        self.reconnect = reconnect
        # The connection's pipeline mode (left and entered again with a new connection).
        self._pipeline = contextlib.ExitStack()
        # Batches of lazy removes and cursor moves alone commit without waiting for the flush.
        self.lazy_acks = lazy_acks
        self.state = state
        self.lock = lock
        self.cond = threading.Condition(lock)
        self.stats = stats
        self.sink = sink
        self.queue: deque[Op] = deque()
        self.cursors: dict[tuple[str, str], int] = {}
        self.failed: BaseException | None = None
        self._on_written = on_written
        self._on_failed = on_failed
        self._closing = False
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, name="sluice-postgres", daemon=True)

    # -- called by the store ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def submit(self, op: Op) -> None:
        """Queue an op. The caller holds `lock`."""
        self.queue.append(op)
        self.stats.pending_writes += 1
        self.stats.pending_write_bytes += op.nbytes
        self.cond.notify()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Write what is queued and end the thread; False if it did not end in time."""
        with self.cond:
            self._closing = True
            self.cond.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("the postgres writer did not stop within %.0f s; leaving it", timeout_s)
            return False
        return True

    def abandon(self) -> None:
        """End the thread after the batch in progress, writing nothing more (a crash)."""
        with self.cond:
            self._abandoned = True
            self._closing = True
            self.cond.notify_all()
        self._thread.join(STOP_TIMEOUT_S)

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            # Pipeline mode for the connection's life: a batch's statements and its COMMIT go in
            # one round trip (leaving the mode after each batch would cost another).
            self._pipeline.enter_context(self.conn.pipeline())
            self._loop()
            self._pipeline.close()
        except (psycopg.Error, OSError) as exc:
            # Leaving pipeline mode on a connection that is gone: the store failed already.
            if self.failed is None:
                log.error("postgres writer: %s", exc)
                self._set_failed(exc)
        except BaseException as exc:  # the thread's boundary: fail loudly, never silently stop
            log.exception("postgres writer failed")
            self._set_failed(exc)

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not (self.queue or self.cursors or self._closing):
                    self.cond.wait()
                if self._abandoned:
                    return
                batch = self._take()
                cursors, self.cursors = self.cursors, {}
                finishing = self._closing and not self.queue
            if batch or cursors:
                self._process(batch, cursors)
            if finishing:
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
            if handle is not None and handle.state is WriteState.PENDING:
                handle.state = WriteState.TAKEN
        self.stats.pending_writes -= len(batch)
        self.stats.pending_write_bytes -= nbytes
        return batch

    def _process(self, batch: list[Op], cursors: dict[tuple[str, str], int]) -> None:
        handles = [op.handle for op in batch if op.handle is not None]
        if self.failed is not None:
            self._fail(batch, handles, self.failed)
            return
        while True:
            try:
                statements, number, lazy, records = self._build(batch, cursors)
            except FencedError as exc:
                self._set_failed(exc)
                self._fail(batch, handles, exc)
                return
            try:
                # One round trip for the whole batch and its COMMIT (the connection is in
                # pipeline mode: the commit sends everything and waits for the results).
                with self.conn.cursor() as cur:
                    statements.run(cur)
                self.conn.commit()
            except (psycopg.Error, OSError) as exc:
                error = self._refused(exc)
                if error is None:
                    try:
                        if self._connect_again(exc, number):
                            break  # the COMMIT in flight took effect
                        continue  # it did not: the state is the database's again; write it
                    except StoreError as gave_up:
                        error = gave_up
                log.error(
                    "postgres: a batch of %d writes failed; the store stops: %s", len(batch), error
                )
                self._set_failed(error)
                self._fail(batch, handles, error)
                return
            break
        with self.lock:
            for handle in handles:
                if handle.state is WriteState.TAKEN:
                    handle.state = WriteState.WRITTEN
            self.stats.written_records += records + len(cursors)
            self.stats.batches += 1
            self.stats.syncs += 0 if lazy else 1
            self._on_written(batch)
        self._deliver(handles)

    def _build(self, batch: list[Op], cursors: dict[tuple[str, str], int]) -> Built:
        """The batch as SQL (`batch.build`), the fencing statement first. Raises FencedError
        when this process no longer holds the lease."""
        fence = self.fence
        first = None
        if fence is not None:
            fence.check()
            first = fence.statement()
        return build(self.state, batch, cursors, first=first, lazy_acks=self.lazy_acks)

    def _refused(self, exc: BaseException) -> BaseException | None:
        """What a failed batch fails with, or None when the connection was lost and may be made
        again."""
        fence = self.fence
        if fence is not None and fence.message in str(exc):
            fence.lost("the database refused a batch for want of the lease")
            return FencedError("the database refused a batch: this broker lost its lease")
        reconnect = self.reconnect
        if reconnect is None or reconnect.timeout_s <= 0 or not connection_lost(self.conn, exc):
            return exc
        return None

    # -- a lost connection -----------------------------------------------------------------------

    def _connect_again(self, lost: BaseException, number: int) -> bool:
        """Connect again (the batch's number `number`, 0 if it writes nothing, was in flight):
        True if that batch committed, False if not (the state is then read back from the
        database). Raises StoreError when no connection came within `reconnect_s`, or the
        store is being dropped, and FencedError when the lease was lost meanwhile."""
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
        with contextlib.suppress(psycopg.Error, OSError):
            self._pipeline.close()
        with contextlib.suppress(psycopg.Error, OSError):
            self.conn.close()
        started = time.monotonic()
        deadline = started + reconnect.timeout_s
        delay = RECONNECT_FIRST_S
        while True:
            if self.fence is not None:
                self.fence.check()
            try:
                conn = reconnect.connect()
            except (StoreError, psycopg.Error, OSError) as exc:
                error: BaseException = exc
            else:
                if self._abandoned:  # dropped as a crash drops it: nothing more is written
                    conn.close()
                    raise StoreError("postgres: the store was dropped while connecting again")
                try:
                    landed = self._learn(conn, number, reconnect)
                except (psycopg.Error, OSError) as exc:
                    conn.close()
                    error = exc
                else:
                    break
            with self.cond:
                if self._abandoned:
                    raise StoreError("postgres: the store was dropped while connecting again")
                if self._closing:  # the broker stops: try a little longer, not for ever
                    deadline = min(deadline, time.monotonic() + STOP_TIMEOUT_S / 2)
                if time.monotonic() + delay > deadline:
                    raise StoreError(
                        f"postgres: no connection within reconnect_s = {reconnect.timeout_s:g} "
                        f"s: {error}"
                    )
                self.cond.wait(delay)
            delay = min(2 * delay, RECONNECT_MAX_S)
        self.conn = conn
        self._pipeline.enter_context(conn.pipeline())
        with self.lock:
            self.stats.unavailable = False
            self.stats.reconnects += 1
        log.warning(
            "postgres: the writer is connected again after %.1f s; the batch in flight %s",
            time.monotonic() - started,
            "had committed" if landed else "is written again",
        )
        return landed

    def _learn(self, conn: psycopg.Connection[Any], number: int, reconnect: Reconnect) -> bool:
        """On a new connection: did batch `number` commit? If not, the writer's state becomes
        the database's."""
        row = conn.execute(_LAST_BATCH).fetchone()
        last = int(row[0]) if row is not None else 0
        # This writer's batches are the only ones (the lease fences any other): the number is
        # there exactly when the batch committed, and nothing of this writer's came after it.
        landed = number in (0, last)
        if not landed:
            self.state = reconnect.read_state(conn)
        conn.commit()
        return landed

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
        # A connection that is gone had its transaction rolled back by the server.
        with contextlib.suppress(psycopg.Error, OSError):
            self.conn.rollback()

    def _fail(self, batch: list[Op], handles: list[WriteHandle], exc: BaseException) -> None:
        error = exc if isinstance(exc, StoreError) else StoreError(f"postgres write failed: {exc}")
        with self.lock:
            for handle in handles:
                if not handle.done:
                    handle.state = WriteState.FAILED
                    handle.error = error
            self._on_failed(batch)
        self._deliver(handles)


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
