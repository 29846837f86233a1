"""`PgLease` against a real PostgreSQL server: taking, waiting, taking over an expired lease,
releasing, the fence on this process's clock and in the database, and a database that goes away
(a lost lease, never a hang). Two `PgLease` objects behave as two brokers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from pgserver import PgServer, fresh_schema
from sluice.errors import FencedError
from sluice.ha.filelease import FENCE_FRACTION
from sluice.ha.pglease import PgLease
from sluice.store.api import StoredMessage, WriteHandle, WriteState
from sluice.store.postgres.store import PostgresStore
from waiting import wait_until

Q = "/queue/fenced"


class Lost:
    """An `on_lost` that remembers why."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


class Completed:
    """The store's completion sink: remembers every handle, and waits for one."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.done: list[WriteHandle] = []

    def __call__(self, handles: list[WriteHandle]) -> None:
        with self.cond:
            self.done.extend(handles)
            self.cond.notify_all()

    def wait(self, handle: WriteHandle) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: handle in self.done, 30)


@pytest.fixture
def schema() -> str:
    return fresh_schema("lease")


@pytest.fixture
def leases() -> Iterator[list[PgLease]]:
    made: list[PgLease] = []
    yield made
    for lease in made:
        lease.release()


def _lease(
    made: list[PgLease], url: str, schema: str, lease_s: float, lost: Lost | None = None
) -> PgLease:
    lease = PgLease(url, lease_s, schema=schema, on_lost=lost)
    made.append(lease)
    return lease


def _row(server: PgServer, schema: str) -> tuple[str, int, bool]:
    with psycopg.connect(server.url(), autocommit=True) as conn:
        row = conn.execute(f'SELECT holder, epoch, released FROM "{schema}".ha_lease').fetchone()
    assert row is not None
    return str(row[0]), int(row[1]), bool(row[2])


def test_first_takes_epoch_1_and_a_second_finds_it_held(
    pg_server: PgServer, schema: str, leases: list[PgLease]
) -> None:
    first = _lease(leases, pg_server.url(), schema, 10.0)
    second = _lease(leases, pg_server.url(), schema, 10.0)
    assert first.acquire() == 1
    first.check()
    assert _row(pg_server, schema) == (first.holder, 1, False)
    assert second.acquire(wait=False) is None
    assert not second.is_held()
    with pytest.raises(FencedError):
        second.check()
    first.renew()
    first.check()


def test_an_expired_lease_is_taken_over_and_its_old_holder_is_fenced(
    pg_server: PgServer, schema: str, leases: list[PgLease]
) -> None:
    lease_s = 1.0
    lost = Lost()
    first = _lease(leases, pg_server.url(), schema, lease_s, lost)
    second = _lease(leases, pg_server.url(), schema, lease_s)
    taken_at = time.monotonic()
    assert first.acquire() == 1  # and never renewed, as if its process froze
    assert second.acquire(wait=False) is None
    epoch = second.acquire()  # waits for the database's clock to pass the expiry
    waited = time.monotonic() - taken_at
    assert epoch == 2
    assert waited >= lease_s * FENCE_FRACTION
    assert _row(pg_server, schema) == (second.holder, 2, False)
    # By its own clock the old holder stopped writing before the takeover was possible.
    with pytest.raises(FencedError):
        first.check()
    assert lost.reasons
    with pytest.raises(FencedError):
        first.renew()


def test_a_released_lease_is_taken_at_once(
    pg_server: PgServer, schema: str, leases: list[PgLease]
) -> None:
    first = _lease(leases, pg_server.url(), schema, 30.0)
    second = _lease(leases, pg_server.url(), schema, 30.0)
    assert first.acquire() == 1
    first.release()
    assert _row(pg_server, schema)[2]
    started = time.monotonic()
    assert second.acquire(wait=False) == 2
    assert time.monotonic() - started < 5.0


def test_a_renewing_master_keeps_its_lease_past_its_time(
    pg_server: PgServer, schema: str, leases: list[PgLease]
) -> None:
    lease_s = 1.0
    master = _lease(leases, pg_server.url(), schema, lease_s)
    slave = _lease(leases, pg_server.url(), schema, lease_s)
    assert master.acquire() == 1
    master.start_renewing()
    stop = threading.Event()
    result: list[int | None] = []
    waiting = threading.Thread(target=lambda: result.append(slave.acquire(stop)))
    waiting.start()
    try:
        deadline = time.monotonic() + 3 * lease_s
        while time.monotonic() < deadline:  # three lease times, the master checked throughout
            master.check()
            assert waiting.is_alive()
            stop.wait(0.05)
    finally:
        stop.set()
        waiting.join(10)
    assert result == [None]
    assert _row(pg_server, schema)[:2] == (master.holder, 1)


def test_the_database_refuses_a_batch_of_a_master_whose_lease_was_taken(
    pg_server: PgServer, schema: str, leases: list[PgLease]
) -> None:
    """The fence in the database: a master that still believes it holds the lease (its clock
    says so) cannot commit once the row names another epoch, and is told it lost the lease."""
    lost = Lost()
    lease = _lease(leases, pg_server.url(), schema, 30.0, lost)
    assert lease.acquire() == 1
    sink = Completed()

    def add(seq: int) -> WriteHandle:
        handle = store.add(StoredMessage(Q, seq, f"m{seq}", 1, {}, b"body"), None)
        sink.wait(handle)
        return handle

    store = PostgresStore(pg_server.url(), schema=schema, fence=lease)
    store.open(sink)
    try:
        assert add(1).state is WriteState.WRITTEN
        with psycopg.connect(pg_server.url(), autocommit=True) as conn:
            conn.execute(
                f'UPDATE "{schema}".ha_lease SET holder = %s, epoch = epoch + 1',
                ("another broker",),
            )
        lease.check()  # its own clock still says it holds the lease
        refused = add(2)
        assert refused.state is WriteState.FAILED
        assert isinstance(refused.error, FencedError)
        assert lost.reasons == ["the database refused a batch for want of the lease"]
        with pytest.raises(FencedError):
            lease.check()
    finally:
        store.close()
    reopened = PostgresStore(pg_server.url(), schema=schema)
    recovery = reopened.open(lambda _handles: None)
    try:
        assert [d.name for d in recovery.destinations] == [Q]
        assert [m.seq for m in reopened.load(Q, 0, 10, 1 << 20)] == [1]
    finally:
        reopened.close()


def test_a_lost_database_is_a_lost_lease_not_a_hang(schema: str) -> None:
    server = PgServer()
    try:
        server.init()
        server.start()
        lease_s = 2.0
        lost = Lost()
        lease = PgLease(server.url(), lease_s, schema=schema, on_lost=lost)
        assert lease.acquire() == 1
        lease.start_renewing()
        lease.check()
        server.stop("immediate")
        stopped_at = time.monotonic()
        wait_until(lambda: bool(lost.reasons), timeout=lease_s * 3)
        assert time.monotonic() - stopped_at <= lease_s + 1.0
        with pytest.raises(FencedError):
            lease.check()
        started = time.monotonic()
        lease.release()  # no hang on the dead connection
        assert time.monotonic() - started < lease_s * 2
    finally:
        server.destroy()


def test_a_database_restart_shorter_than_the_fence_keeps_the_lease_and_the_writes(
    schema: str,
) -> None:
    """The lease's connection and the store's writer both connect again: a master whose
    database restarts (a clean stop and start, about a second) well within its fence keeps the
    lease, and a write queued while the database was down is committed under it."""
    server = PgServer()
    lease_s = 8.0
    lost = Lost()
    sink = Completed()
    server.init()
    server.start()
    lease = PgLease(server.url(), lease_s, schema=schema, on_lost=lost)
    try:
        assert lease.acquire() == 1
        lease.start_renewing()
        store = PostgresStore(server.url(), schema=schema, fence=lease)
        store.open(sink)
        try:
            server.stop("fast")
            waiting = store.add(StoredMessage(Q, 1, "m1", 1, {}, b"while down"), None)
            server.start()
            sink.wait(waiting)
            assert waiting.state is WriteState.WRITTEN
            lease.check()
            assert lost.reasons == []
            assert [m.body for m in store.load(Q, 0, 10, 1 << 20)] == [b"while down"]
        finally:
            store.close()
        assert _row(server, schema) == (lease.holder, 1, False)
    finally:
        lease.release()
        server.destroy()


def test_a_master_frozen_inside_a_batch_does_not_keep_the_lease_from_a_new_master(
    pg_server: PgServer, schema: str, leases: list[PgLease]
) -> None:
    """A batch holds the lease's row locked from its fence to its COMMIT. A master frozen in
    between (here: its writer held before the COMMIT) past its lease has that session ended by
    the broker taking over, and the frozen batch never commits."""
    lease_s = 1.0
    master = _lease(leases, pg_server.url(), schema, lease_s, Lost())
    assert master.acquire() == 1
    done: list[WriteHandle] = []
    store = PostgresStore(pg_server.url(), schema=schema, fence=master)
    store.open(done.extend)
    writer = store._writer
    assert writer is not None
    real_commit = writer.conn.commit
    held, release = threading.Event(), threading.Event()

    def frozen_commit() -> None:
        held.set()
        release.wait(60)
        real_commit()

    writer.conn.commit = frozen_commit  # type: ignore[method-assign]
    try:
        handle = store.add(StoredMessage(Q, 1, "m1", 1, {}, b"body"), None)
        assert held.wait(30)
        with psycopg.connect(pg_server.url(), autocommit=True) as conn:
            wait_until(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                        "WHERE c.relname = 'ha_lease' AND l.mode = 'RowShareLock' AND l.granted"
                    ).fetchone()
                    == (1,)
                ),
                timeout=10,
                what="the frozen batch's lock on the lease's row",
            )
        slave = _lease(leases, pg_server.url(), schema, lease_s)
        started = time.monotonic()
        assert slave.acquire() == 2
        assert time.monotonic() - started < lease_s + 3
        release.set()
        wait_until(lambda: handle in done, timeout=30)
        assert handle.state is WriteState.FAILED
    finally:
        release.set()
        store.close()
    reopened = PostgresStore(pg_server.url(), schema=schema)
    reopened.open(lambda _handles: None)
    try:
        assert reopened.load(Q, 0, 10, 1 << 20) == []
    finally:
        reopened.close()
