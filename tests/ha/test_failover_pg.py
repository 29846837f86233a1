"""Master/slave on one PostgreSQL store with real broker processes and a real server: the lease is
a row of the store's database. A master killed with SIGKILL under load from producers and consumers
(our client, with both addresses) is replaced by the slave once the lease expires by the
database's clock, and every receipted message is delivered, none twice unless flagged
redelivered; a master frozen (SIGSTOP) past its lease and then resumed is refused by the
database and exits."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import psycopg
import pytest

from ha.harness import Load, ha_pair, run_failovers
from pgserver import PgServer, fresh_schema

pytestmark = pytest.mark.crash


def _lease_row(server: PgServer, schema: str) -> tuple[str, int]:
    with psycopg.connect(server.url(), autocommit=True) as conn:
        row = conn.execute(f'SELECT holder, epoch FROM "{schema}".ha_lease').fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def test_sigkill_of_a_postgres_master_under_load(tmp_path: Path, pg_server: PgServer) -> None:
    lease_s = 3.0
    schema = fresh_schema("ha")
    with ha_pair(tmp_path, lease_s, postgres=(pg_server.url(), schema)) as pair:
        master = pair.launch("a")
        master.wait_listening()
        slave = pair.launch("b")
        slave.wait_log("waiting for the lease .* held by .*")

        async def scenario() -> float:
            load = Load(pair.brokers, producers=3, consumers=2)
            try:
                await load.ledger.wait_receipted(300)
                killed_at = time.monotonic()
                master.kill()
                await asyncio.to_thread(slave.wait_listening, 30)
                takeover_s = time.monotonic() - killed_at
                await load.ledger.wait_receipted(len(load.ledger.receipted) + 300)
                ledger = await load.finish()
            except BaseException:
                await load.cancel()
                raise
            ledger.check()
            return takeover_s

        takeover_s = asyncio.run(scenario())
        print(f"failover on PostgreSQL: takeover {takeover_s:.2f} s (lease_s {lease_s:g})")
        assert takeover_s < lease_s + 3
        holder, epoch = _lease_row(pg_server, schema)
        assert epoch == 2
        assert holder.split(":")[1] == str(slave.pid)
        assert slave.stop() == 0


def test_a_frozen_postgres_master_resumed_is_refused_and_exits(
    tmp_path: Path, pg_server: PgServer
) -> None:
    lease_s = 2.0
    schema = fresh_schema("ha")
    with ha_pair(tmp_path, lease_s, postgres=(pg_server.url(), schema)) as pair:
        master = pair.launch("a")
        master.wait_listening()
        slave = pair.launch("b")
        slave.wait_log("waiting for the lease")

        async def scenario() -> None:
            load = Load(pair.brokers, producers=2, consumers=1)
            try:
                await load.ledger.wait_receipted(200)
                os.kill(master.pid, signal.SIGSTOP)
                await asyncio.to_thread(slave.wait_listening, 30)
                os.kill(master.pid, signal.SIGCONT)
                assert await asyncio.to_thread(master.proc.wait, 30) == 3  # type: ignore[union-attr]
                await load.ledger.wait_receipted(len(load.ledger.receipted) + 200)
                ledger = await load.finish()
            except BaseException:
                await load.cancel()
                raise
            ledger.check()

        asyncio.run(scenario())
        assert "lost the lease" in master.log_text
        assert "exiting at once without writing" in master.log_text
        holder, epoch = _lease_row(pg_server, schema)
        assert epoch == 2
        assert holder.split(":")[1] == str(slave.pid)
        assert slave.stop() == 0


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_one_hundred_failovers_on_postgres(tmp_path: Path, pg_server: PgServer) -> None:
    lease_s = 3.0
    rounds = 100
    schema = fresh_schema("ha")
    with ha_pair(tmp_path, lease_s, postgres=(pg_server.url(), schema)) as pair:
        run = run_failovers(pair, rounds)
        print(run.summary(f"on PostgreSQL, SIGKILL, lease_s {lease_s:g}"))
        run.ledger.check()
        assert _lease_row(pg_server, schema)[1] == rounds + 1
        assert max(run.takeovers) < lease_s + 3
        assert run.master.stop() == 0
