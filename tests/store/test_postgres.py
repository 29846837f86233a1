"""The PostgreSQL store beyond the contract suite: its schema and migrations, bodies in chunks,
keyset paging, what an unfinished transaction leaves after a crash, a server that crashes under
it, its configuration, and a broker on it killed and restarted. Everything runs against the
session's real PostgreSQL server (`pg_server`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from brokerproc import BrokerProcess
from ha.harness import QUEUE, Ledger, Load
from pgserver import PgServer, fresh_schema
from sluice import config as config_mod
from sluice.client import Client
from sluice.errors import ConfigError, StoreError, StoreOfflineError
from sluice.store.api import WriteHandle, WriteState
from sluice.store.postgres.schema import CHUNK_BYTES, SCHEMA_VERSION, encode_headers, migrate_to
from sluice.store.postgres.store import PostgresStore
from sluice.store.postgres.urls import safe_url

from .helpers import Harness, Sink, fields, msg

Q = "/queue/pg"


@pytest.fixture
def schema() -> str:
    return fresh_schema()


@pytest.fixture
def h(pg_server: PgServer, schema: str) -> Iterator[Harness]:
    url = pg_server.url()
    harness = Harness("postgres", lambda: PostgresStore(url, schema=schema, dedup_window=5))
    harness.open()
    yield harness
    harness.close()


def _sql(server: PgServer, schema: str, query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        cur = conn.execute(query)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description is not None else []


def test_schema_is_created_at_its_version_and_reopened_without_migrating(
    h: Harness, pg_server: PgServer, schema: str
) -> None:
    assert h.recovery is not None
    assert h.recovery.report == [
        f"postgres: schema '{schema}' migrated from version {n} to {n + 1}"
        for n in range(SCHEMA_VERSION)
    ]
    assert _sql(pg_server, schema, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    tables = _sql(
        pg_server,
        schema,
        f"SELECT tablename FROM pg_tables WHERE schemaname = '{schema}' ORDER BY tablename",
    )
    assert [t for (t,) in tables] == [
        "dedup_ids",
        "destinations",
        "message_chunks",
        "messages",
        "schema_version",
        "subscriptions",
        "writer_batch",
    ]
    assert h.reopen().report == []


def test_a_schema_of_version_1_is_migrated_with_its_messages(
    pg_server: PgServer, schema: str
) -> None:
    """Version 1 had no `writer_batch`: the migration adds it, and the messages stay."""
    with psycopg.connect(pg_server.url()) as conn:
        migrate_to(conn, schema, 1)
        conn.execute(f"SET search_path TO {schema}")
        conn.execute("INSERT INTO destinations VALUES (1, %s, true, 0, 0)", (Q,))
        conn.execute(
            "INSERT INTO messages (id, dest_id, seq, message_id, timestamp_ms, expires_ms, "
            "priority, persistent, size, headers, body) "
            "VALUES (1, 1, 1, 'id-1', 1000, 0, 4, true, 4, %s, 'kept')",
            (encode_headers({}),),
        )
    h = Harness("postgres", lambda: PostgresStore(pg_server.url(), schema=schema))
    recovery = h.open()
    try:
        assert recovery.report == [
            f"postgres: schema '{schema}' migrated from version {n} to {n + 1}"
            for n in range(1, SCHEMA_VERSION)
        ]
        assert [m.body for m in h.s.load(Q, 0, 10, 1 << 20)] == [b"kept"]
        h.track(h.s.add(msg(Q, 2), None))
        h.settle()
        assert _sql(pg_server, schema, "SELECT batch FROM writer_batch") == [(1,)]
    finally:
        h.close()


def test_a_schema_from_a_newer_sluice_is_refused(
    h: Harness, pg_server: PgServer, schema: str
) -> None:
    h.close()
    h.store = None
    _sql(pg_server, schema, f"UPDATE schema_version SET version = {SCHEMA_VERSION + 1}")
    store = PostgresStore(pg_server.url(), schema=schema)
    with pytest.raises(StoreError, match=f"version {SCHEMA_VERSION + 1}, written by a newer"):
        store.open(h.sink)


def test_large_bodies_are_stored_in_chunks(h: Harness, pg_server: PgServer, schema: str) -> None:
    big = bytes(range(256)) * (3 * CHUNK_BYTES // 256) + b"tail"
    h.track(h.s.add(msg(Q, 1, big), None))
    h.track(h.s.add(msg(Q, 2, b"small"), None))
    h.settle()
    rows = _sql(pg_server, schema, "SELECT chunks, body IS NULL FROM messages ORDER BY seq")
    assert rows == [(4, True), (0, False)]
    stored = _sql(pg_server, schema, "SELECT max(length(data)) FROM message_chunks")
    assert stored == [(CHUNK_BYTES,)]
    h.reopen()
    assert [m.body for m in h.s.load(Q, 0, 10, 1 << 30)] == [big, b"small"]
    h.track(h.s.remove(Q, 1))
    h.settle()
    assert _sql(pg_server, schema, "SELECT count(*) FROM message_chunks") == [(0,)]
    # Every way a message goes takes its chunks along: an abort, a range, a destination delete.
    h.s.begin("big")
    h.track(h.s.add(msg(Q, 0, big), None, "big"))
    h.track(h.s.add(msg(Q, 3, big), None))
    h.track(h.s.add(msg("/queue/other", 1, big), None))
    h.settle()
    assert _sql(pg_server, schema, "SELECT count(*) FROM message_chunks") == [(12,)]
    h.s.abort("big")
    h.track(h.s.remove_range(Q, 3))
    h.track(h.s.delete_destination("/queue/other"))
    h.settle()
    assert _sql(pg_server, schema, "SELECT count(*) FROM message_chunks") == [(0,)]


def test_keyset_pages_over_many_rows_with_removes_and_pending_writes(h: Harness) -> None:
    originals = [msg(Q, seq, bytes([seq % 251]) * (seq % 7)) for seq in range(1, 1301)]
    for m in originals[:1200]:
        h.track(h.s.add(m, None))
    h.settle()
    for seq in range(2, 1200, 3):
        h.track(h.s.remove(Q, seq))
    h.track(h.s.remove_range(Q, 100))
    for m in originals[1200:]:  # queued, perhaps not written yet: shown at once all the same
        h.track(h.s.add(m, None))
    expected = [
        fields(m) for m in originals if m.seq > 100 and not (m.seq < 1200 and m.seq % 3 == 2)
    ]

    def pages(count: int) -> list[tuple[object, ...]]:
        out, after = [], 0
        while page := h.s.load(Q, after, count, 1 << 30):
            assert len(page) <= count
            out += [fields(m) for m in page]
            after = page[-1].seq
        return out

    assert pages(700) == expected
    assert pages(13) == expected
    assert h.s.first_seq(Q) == 102  # 101 was removed
    h.reopen()
    assert pages(1000) == expected


def test_a_crash_drops_unfinished_transactions_and_keeps_what_was_committed(
    h: Harness, pg_server: PgServer
) -> None:
    h.track(h.s.add(msg(Q, 1, b"kept"), None))
    h.s.begin("open-tx")
    h.track(h.s.add(msg(Q, 0, b"never committed"), None, "open-tx"))
    h.track(h.s.remove(Q, 1, None, "open-tx"))
    h.settle()
    store = h.s
    assert isinstance(store, PostgresStore)
    store.abandon()  # the broker process is gone: no close
    recovery = h.open()
    assert recovery.report == ["postgres: 1 messages of unfinished transactions dropped"]
    assert [m.body for m in h.s.load(Q, 0, 10, 1 << 20)] == [b"kept"]
    assert [(d.name, d.last_seq, d.message_count) for d in recovery.destinations] == [(Q, 1, 1)]


def test_without_reconnect_a_server_crash_fails_the_store_and_a_reopen_has_every_commit(
    pg_server: PgServer, schema: str
) -> None:
    h = Harness("postgres", lambda: PostgresStore(pg_server.url(), schema=schema, reconnect_s=0))
    h.open()
    for seq in range(1, 6):
        h.track(h.s.add(msg(Q, seq), None))
    h.settle()
    pg_server.restart_immediate()
    late = h.s.add(msg(Q, 6), None)
    h.sink.wait([late])
    assert late.state is WriteState.FAILED
    assert isinstance(late.error, StoreError)
    assert h.s.stats().write_errors == 1
    after = h.s.add(msg(Q, 7), None)
    h.sink.wait([after])
    assert after.state is WriteState.FAILED  # a failed store takes no more writes
    h.s.close()
    h.open()
    assert [m.seq for m in h.s.load(Q, 0, 100, 1 << 30)] == [1, 2, 3, 4, 5]
    h.close()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_writes_wait_while_the_server_is_down_and_are_written_once_it_is_back(
    h: Harness, pg_server: PgServer, schema: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    for seq in range(1, 4):
        h.track(h.s.add(msg(Q, seq), None))
    h.settle()
    # Waited for, so flushed: a crash of the server keeps it (a lazy one may come back).
    h.track(h.s.remove(Q, 1, lambda handle: None))
    h.settle()
    pg_server.stop(mode)
    try:
        waiting = [h.s.add(msg(Q, seq, f"while down {seq}".encode()), None) for seq in (4, 5)]
        acked = h.s.remove(Q, 2, None)
        # Nothing completes while the server is down: the writer holds the batch.
        with pytest.raises(AssertionError, match="not delivered in time"):
            h.sink.wait([*waiting, acked], timeout=1.0)
        assert all(not handle.done for handle in [*waiting, acked])
        assert h.s.stats().unavailable
        # A read of what is committed cannot be served; what is queued is not lost for it.
        with pytest.raises(StoreOfflineError):
            h.s.load(Q, 0, 10, 1 << 20)
    finally:
        pg_server.start()
    h.sink.wait([*waiting, acked])
    assert [handle.state for handle in [*waiting, acked]] == [WriteState.WRITTEN] * 3
    assert "the batch in flight is written again" in caplog.text
    stats = h.s.stats()
    assert (stats.unavailable, stats.reconnects, stats.write_errors) == (False, 1, 0)
    # Once the writer is connected again, the next read connects again too.
    page = h.s.load(Q, 0, 10, 1 << 20)
    assert [(m.seq, m.body) for m in page] == [
        (3, b"body"),
        (4, b"while down 4"),
        (5, b"while down 5"),
    ]
    h.reopen()
    assert [m.seq for m in h.s.load(Q, 0, 10, 1 << 20)] == [3, 4, 5]


def test_a_commit_that_took_effect_without_an_answer_is_not_written_again(
    h: Harness, pg_server: PgServer, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server commits the batch locally and then waits for a synchronous standby that does
    not exist; the writer's backend is terminated before it answers. After connecting again
    the writer finds the batch's number in `writer_batch` and does not write it a second time
    (a second write would break the unique (dest_id, seq) key, failing the store)."""
    h.track(h.s.add(msg(Q, 1), None))
    h.settle()
    store = h.s
    assert isinstance(store, PostgresStore)
    backend = store.writer_backend_pid
    with psycopg.connect(pg_server.url(), autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        admin.execute("SELECT pg_reload_conf()")
        try:
            admin.execute("SET synchronous_commit TO local")
            # The postmaster reloads, then signals every backend; a backend reads the new
            # setting between two protocol messages (the writer's before its COMMIT).
            deadline = time.monotonic() + 20
            while admin.execute("SHOW synchronous_standby_names").fetchone() != ("nobody",):
                assert time.monotonic() < deadline, "the server never reloaded its settings"
                time.sleep(0.05)  # polling the server's view of its settings
            in_doubt = store.add(msg(Q, 2, b"committed, unanswered"), None)
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event = %s"
            deadline = time.monotonic() + 20
            while admin.execute(waiting, (backend, "SyncRep")).fetchone() != (1,):
                assert time.monotonic() < deadline, (
                    "the COMMIT never waited for the standby",
                    in_doubt.state,
                    admin.execute(
                        "SELECT pid, state, wait_event, query FROM pg_stat_activity"
                    ).fetchall(),
                )
                time.sleep(0.05)  # polling the server's view of its backend
            # Before the standby setting goes: that would let the COMMIT answer.
            admin.execute("SELECT pg_terminate_backend(%s, 10000)", (backend,))
            h.sink.wait([in_doubt])
        finally:
            admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
            admin.execute("SELECT pg_reload_conf()")
    assert in_doubt.state is WriteState.WRITTEN
    assert store.stats().reconnects == 1
    assert "the batch in flight had committed" in caplog.text
    after = h.track(store.add(msg(Q, 3), None))
    h.settle()
    assert after.state is WriteState.WRITTEN
    assert [m.seq for m in store.load(Q, 0, 10, 1 << 20)] == [1, 2, 3]
    assert _sql(pg_server, schema, "SELECT seq FROM messages ORDER BY seq") == [(1,), (2,), (3,)]


def test_safe_url_never_shows_the_password() -> None:
    shown = safe_url("postgresql://sluice:s3cret@127.0.0.1:5432/db")
    assert "s3cret" not in shown
    assert "host=127.0.0.1" in shown
    assert "password=***" in shown
    assert "s3cret" not in safe_url("host=h password=s3cret dbname=d")
    assert safe_url("postgresql://[broken") == "<unparsable PostgreSQL URL>"


@pytest.mark.parametrize(
    ("toml", "error"),
    [
        ('kind = "postgres"', "needs store.url"),
        ('kind = "postgres"\nurl = "mysql://u:pw@h/db"', "got a mysql:// URL"),
        ('kind = "postgres"\nurl = "just-a-name"', "key=value connection string"),
        ('kind = "postgres"\nurl = "postgresql://h/db"\nschema = "Bad-Name"', "store.schema"),
        ('kind = "postgres"\nurl = "postgresql://h/db"\nwrite_connections = 0', "1 to 4"),
    ],
)
def test_store_settings_are_checked(tmp_path: Path, toml: str, error: str) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text(f"[store]\n{toml}\n")
    with pytest.raises(ConfigError, match=error) as info:
        config_mod.load(path)
    assert "pw@" not in str(info.value)


def test_store_settings_load_and_the_url_stays_out_of_the_repr(tmp_path: Path) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text('[store]\nkind = "postgres"\nurl = "postgresql://u:pw@h/db"\nschema = "mq"\n')
    cfg = config_mod.load(path)
    assert cfg.store.kind is config_mod.StoreKind.POSTGRES
    assert (cfg.store.url, cfg.store.schema) == ("postgresql://u:pw@h/db", "mq")
    assert "pw" not in repr(cfg.store)


def test_a_broker_on_postgres_keeps_receipted_messages_through_a_kill(
    pg_server: PgServer, tmp_path: Path
) -> None:
    schema = fresh_schema("broker")
    # Trust authentication accepts any password: this one must never reach the log.
    url = f"postgresql://sluice:s3cret@127.0.0.1:{pg_server.port}/postgres"
    config = f'[store]\nschema = "{schema}"\ndata_dir = "{tmp_path / "data"}"\n'
    args = ("--store", "postgres", "--postgres-url", url, "--no-http")
    broker = BrokerProcess(config, tmp_path, *args).start()
    try:
        assert "s3cret" not in broker.log_text
        assert f"schema {schema}" in broker.log_text

        async def send() -> None:
            async with await Client.connect(f"127.0.0.1:{broker.port}") as client:
                for n in range(50):
                    await client.send("/queue/orders", f"m{n}", persistent=True)

        asyncio.run(send())
        broker.kill()
        broker = BrokerProcess(config, tmp_path, *args).start()

        async def receive() -> list[bytes]:
            async with await Client.connect(f"127.0.0.1:{broker.port}") as client:
                sub = await client.subscribe("/queue/orders", ack="client-individual")
                bodies = []
                for _ in range(50):
                    message = await sub.get(timeout=10)
                    assert message is not None
                    bodies.append(message.body)
                    await client.ack(message, receipt=True)
                assert await sub.get(timeout=0.2) is None
                return bodies

        assert asyncio.run(receive()) == [f"m{n}".encode() for n in range(50)]
        assert "s3cret" not in broker.log_text
    finally:
        with contextlib.suppress(Exception):
            broker.stop()
    assert _sql(pg_server, schema, "SELECT count(*) FROM messages") == [(0,)]


def test_a_broker_on_postgres_rides_through_server_restarts_under_load(
    pg_server: PgServer, tmp_path: Path
) -> None:
    """Three producers (each SEND waiting for its RECEIPT) and two consumers on a broker whose
    PostgreSQL server stops, stays down for a while and starts again, twice (a clean stop, then
    a crash): while it is down no RECEIPT comes, the clients stay connected, and afterwards
    every receipted message is delivered, none twice unless flagged redelivered."""
    schema = fresh_schema("restart")
    config = f'[store]\nschema = "{schema}"\ndata_dir = "{tmp_path / "data"}"\n'
    args = ("--store", "postgres", "--postgres-url", pg_server.url(), "--no-http")
    broker = BrokerProcess(config, tmp_path, *args).start()
    outages: list[tuple[float, float]] = []

    async def scenario() -> Ledger:
        load = Load(f"127.0.0.1:{broker.port}", producers=3, consumers=2)
        try:
            for nth, mode in enumerate(("fast", "immediate"), start=1):
                await load.ledger.wait_receipted(len(load.ledger.receipted) + 200)
                await asyncio.to_thread(pg_server.stop, mode)
                await asyncio.to_thread(broker.wait_log, "writer lost its connection", nth=nth)
                down_at = time.monotonic()
                await asyncio.sleep(1.5)  # the outage: the server stays down this long
                before = len(load.ledger.receipted)
                await asyncio.to_thread(pg_server.start)
                outages.append((down_at, time.monotonic()))
                assert len(load.ledger.receipted) == before
                await asyncio.to_thread(broker.wait_log, "writer is connected again", nth=nth)
            await load.ledger.wait_receipted(len(load.ledger.receipted) + 200)
            return await load.finish()
        except BaseException:
            await load.cancel()
            raise

    try:
        ledger = asyncio.run(scenario())
        ledger.check()
        for down_at, up_at in outages:
            # A RECEIPT of a batch committed just before the stop may still be on its way.
            during = [at for at in ledger.receipted.values() if down_at + 0.2 < at < up_at]
            assert not during, f"{len(during)} receipts while the server was down"
        assert broker.proc is not None
        assert broker.proc.poll() is None
        assert broker.stop() == 0
        # An ACK without a receipt commits without waiting for the WAL flush: the crash may
        # have taken a few such removes, whose messages come back, flagged, never lost.
        broker = BrokerProcess(config, tmp_path, *args).start()

        async def drain() -> list[tuple[str, bool]]:
            async with await Client.connect(f"127.0.0.1:{broker.port}") as client:
                sub = await client.subscribe(QUEUE, ack="client-individual")
                back = []
                while (message := await sub.get(timeout=1.0)) is not None:
                    back.append((message.text, message.redelivered))
                    await client.ack(message, receipt=True)
                return back

        back = asyncio.run(drain())
        print(f"came back after the crash: {back}")
        assert {body for body, _ in back} <= ledger.deliveries.keys()
        assert all(redelivered for _, redelivered in back)
    finally:
        if not pg_server.running:
            pg_server.start()
        with contextlib.suppress(Exception):
            broker.stop()
    assert _sql(pg_server, schema, "SELECT count(*) FROM messages") == [(0,)]


@pytest.mark.parametrize("sync_acks", [False, True])
def test_removes_nobody_waits_for_commit_without_a_flush_unless_sync_acks(
    pg_server: PgServer, schema: str, sync_acks: bool
) -> None:
    harness = Harness(
        "postgres", lambda: PostgresStore(pg_server.url(), schema=schema, sync_acks=sync_acks)
    )
    harness.open()
    try:
        harness.track(harness.s.add(msg(Q, 1), None))
        harness.settle()
        syncs = harness.s.stats().syncs
        harness.track(harness.s.remove(Q, 1))  # an ack without a receipt
        harness.settle()
        assert harness.s.stats().syncs == syncs + (1 if sync_acks else 0)
        waited = harness.track(harness.s.add(msg(Q, 2), None))
        harness.settle()
        assert waited.state is WriteState.WRITTEN
        assert harness.s.stats().syncs == syncs + (2 if sync_acks else 1)
        harness.reopen()
        assert [m.seq for m in harness.s.load(Q, 0, 10, 1 << 20)] == [2]
    finally:
        harness.close()


class _GatedSink(Sink):
    """A sink that holds the writer thread inside the completion of `gate` until `open`, so
    what the test queues meanwhile waits for the writer, all of it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: object = None
        self.opened = threading.Event()

    def __call__(self, handles: Sequence[WriteHandle]) -> None:
        super().__call__(handles)
        if any(h is self.gate for h in handles):
            assert self.opened.wait(20), "the gate was never opened"


def test_range_removes_and_a_deleted_destination_stay_hidden_while_queued(
    pg_server: PgServer, schema: str
) -> None:
    sink = _GatedSink()
    harness = Harness("postgres", lambda: PostgresStore(pg_server.url(), schema=schema), sink)
    harness.open()
    try:
        for seq in range(1, 11):
            harness.track(harness.s.add(msg(Q, seq), None))
        harness.settle()
        sink.gate = harness.track(harness.s.mark_dispatched("/queue/gate", 1))
        sink.wait([sink.gate])  # the writer is held: everything below is queued
        harness.track(harness.s.remove_range(Q, 8))
        harness.track(harness.s.remove_range(Q, 3))  # a lower floor hides no less
        assert loaded_seqs(harness) == [9, 10]
        harness.track(harness.s.delete_destination(Q))
        for seq in (1, 2, 3):  # the destination created again
            harness.track(harness.s.add(msg(Q, seq, b"new"), None))
        harness.track(harness.s.remove_range(Q, 2))
        assert loaded_seqs(harness) == [3]
        sink.opened.set()
        harness.settle()
        assert loaded_seqs(harness) == [3]
        harness.reopen()
        assert loaded_seqs(harness) == [3]
    finally:
        sink.opened.set()
        harness.close()


def loaded_seqs(harness: Harness) -> list[int]:
    return [m.seq for m in harness.s.load(Q, 0, 100, 1 << 30)]


def _writer_waits(server: PgServer, pids: Sequence[int], count: int) -> None:
    """Wait until `count` of the writer's backends `pids` wait for a lock."""
    with psycopg.connect(server.url(), autocommit=True) as conn:
        deadline = time.monotonic() + 20
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND wait_event_type = 'Lock'"
        )
        while conn.execute(query, (list(pids),)).fetchone() != (count,):
            assert time.monotonic() < deadline, conn.execute(
                "SELECT pid, wait_event_type, wait_event, query FROM pg_stat_activity"
            ).fetchall()
            time.sleep(0.02)  # polling the server's view of its backends


@contextlib.contextmanager
def _messages_locked(server: PgServer, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """Another session holds the messages table: a batch that writes to it waits, holding the
    chain's row (every later batch waits behind it), until the session ends."""
    conn = psycopg.connect(server.url())
    try:
        conn.execute(f"LOCK TABLE {schema}.messages IN EXCLUSIVE MODE")  # type: ignore[arg-type]
        yield conn
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.rollback()
        conn.close()


def test_a_batch_that_removes_what_the_batch_before_adds_runs_beside_it(
    h: Harness, pg_server: PgServer, schema: str
) -> None:
    """Batch 2 removes the message batch 1 adds, sent on the second connection while batch 1
    is still open: it waits on the chain for batch 1's COMMIT, so its delete sees the row and
    nothing comes back after a reopen. Completions come in batch order."""
    h.track(h.s.add(msg(Q, 1, b"before"), None))
    h.settle()
    store = h.s
    assert isinstance(store, PostgresStore)
    pids = store.writer_backend_pids
    assert len(pids) == 2
    with _messages_locked(pg_server, schema) as locker:
        added = h.track(store.add(msg(Q, 2, b"added, then removed"), None))
        _writer_waits(pg_server, pids, 1)  # batch 1 is open, its add not written yet
        removed = h.track(store.remove(Q, 2, lambda handle: None))
        _writer_waits(pg_server, pids, 2)  # batch 2 waits on the chain, on the other connection
        assert not added.done
        assert not removed.done
        locker.rollback()
        h.sink.wait([added, removed])
    assert [added.state, removed.state] == [WriteState.WRITTEN] * 2
    delivered = h.sink.delivered
    assert delivered.index(added) < delivered.index(removed)
    assert loaded_seqs(h) == [1]
    assert _sql(pg_server, schema, "SELECT seq FROM messages") == [(1,)]
    h.reopen()
    assert loaded_seqs(h) == [1]


@pytest.mark.parametrize("lost", ["first", "second"])
def test_a_lost_connection_with_two_batches_in_flight_writes_each_once(
    h: Harness, pg_server: PgServer, schema: str, lost: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two batches in flight, one on each connection; the server ends the connection of the
    first (both roll back: the second waited on the chain for it) or of the second (the first
    commits). The writer connects again and writes what did not commit, once."""
    h.track(h.s.add(msg(Q, 1, b"before"), None))
    h.settle()
    store = h.s
    assert isinstance(store, PostgresStore)
    first, second = store.writer_backend_pids
    with _messages_locked(pg_server, schema) as locker:
        one = h.track(store.add(msg(Q, 2, b"first batch"), None))
        _writer_waits(pg_server, [first], 1)
        two = h.track(store.add(msg(Q, 3, b"second batch"), None))
        _writer_waits(pg_server, [first, second], 2)
        with psycopg.connect(pg_server.url(), autocommit=True) as admin:
            victim = first if lost == "first" else second
            admin.execute("SELECT pg_terminate_backend(%s, 10000)", (victim,))
        locker.rollback()
        h.sink.wait([one, two])
    assert [one.state, two.state] == [WriteState.WRITTEN] * 2
    delivered = h.sink.delivered
    assert delivered.index(one) < delivered.index(two)
    # The first's failure is seen with the second still waiting behind it; the second's only
    # once the first has been completed.
    seen = {
        "first": "of 2 batches in flight 0 had committed",
        "second": "the batch in flight is written again",
    }
    assert seen[lost] in caplog.text
    stats = store.stats()
    assert (stats.reconnects, stats.write_errors, stats.unavailable) == (1, 0, False)
    assert _sql(pg_server, schema, "SELECT seq, body FROM messages ORDER BY seq") == [
        (1, b"before"),
        (2, b"first batch"),
        (3, b"second batch"),
    ]
    after = h.track(store.add(msg(Q, 4), None))
    h.settle()
    assert after.state is WriteState.WRITTEN
    h.reopen()
    assert loaded_seqs(h) == [1, 2, 3, 4]


def test_the_chain_refuses_a_batch_whose_predecessor_did_not_commit(
    h: Harness, pg_server: PgServer, schema: str
) -> None:
    """`writer_chain(prev, next)` moves the row on from `prev` only, and refuses a batch whose
    number does not follow the last batch committed."""
    (last,) = _sql(pg_server, schema, "SELECT batch FROM writer_batch")[0]
    assert isinstance(last, int)
    _sql(pg_server, schema, f"SELECT writer_chain({last}, {last + 1})")
    assert _sql(pg_server, schema, "SELECT batch FROM writer_batch") == [(last + 1,)]
    with pytest.raises(psycopg.errors.RaiseException, match="writer chain broken"):
        _sql(pg_server, schema, f"SELECT writer_chain({last + 5}, {last + 6})")
    with pytest.raises(psycopg.errors.RaiseException, match="writer chain broken"):
        _sql(pg_server, schema, f"SELECT writer_chain({last - 1}, {last})")
    assert _sql(pg_server, schema, "SELECT batch FROM writer_batch") == [(last + 1,)]
