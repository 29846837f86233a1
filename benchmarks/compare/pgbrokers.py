"""The brokers that keep their messages in PostgreSQL, for the benchmarks: Sluice on its
PostgreSQL store (`sluice-postgres`) and ActiveMQ on its JDBC persistence adapter
(`activemq-jdbc`), both on one throwaway PostgreSQL server started for the run
(`tests/pgserver.py`: Debian's initdb and pg_ctl, 127.0.0.1, fsync on). Each start gets a new
empty database, dropped once the broker has stopped, as the file stores get an empty data
directory.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from compare.brokers import PeerBroker, Running, SluiceBroker
from compare.procs import TaskCap

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from pgserver import PgServer  # noqa: E402 - the tests' server fixture, shared here

__all__ = [
    "PG_BROKER_NAMES",
    "ActiveMQJdbcBroker",
    "PgDatabases",
    "PgServer",
    "SluicePostgresBroker",
    "make_pg_broker",
]

PG_BROKER_NAMES = ("sluice-postgres", "activemq-jdbc")


class PgDatabases:
    """Fresh databases on one server, one per broker start."""

    def __init__(self, server: PgServer) -> None:
        self.server = server
        self._numbers = itertools.count(1)

    def create(self) -> str:
        name = f"bench_{os.getpid()}_{next(self._numbers)}"
        with psycopg.connect(self.server.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def drop(self, name: str) -> None:
        with psycopg.connect(self.server.url(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def describe(self) -> dict[str, Any]:
        """The server's version and durability settings, for the record."""
        names = ("server_version", "fsync", "synchronous_commit", "wal_sync_method")
        with psycopg.connect(self.server.url(), autocommit=True) as conn:
            rows = [
                conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(n))).fetchone() for n in names
            ]
        return {name: row[0] if row else None for name, row in zip(names, rows, strict=True)}


class SluicePostgresBroker(SluiceBroker):
    """`sluice broker --store postgres --postgres-url URL` on a new database."""

    def __init__(self, executable: Path, python: Path, databases: PgDatabases) -> None:
        super().__init__(executable, python, name="sluice-postgres", label="Sluice (PostgreSQL)")
        self.databases = databases
        self.database: str | None = None

    def store_args(self, data_dir: Path) -> list[str]:
        self.database = self.databases.create()
        url = self.databases.server.url(self.database)
        return ["--store", "postgres", "--postgres-url", url, "--data", str(data_dir)]

    def stop(self) -> None:
        super().stop()
        if self.database is not None:
            self.databases.drop(self.database)
            self.database = None


class ActiveMQJdbcBroker(PeerBroker):
    """ActiveMQ with `jdbcPersistenceAdapter` on a new database (`activemq.sh`,
    ACTIVEMQ_JDBC_URL)."""

    def __init__(self, script: Path, bench_args: list[str], databases: PgDatabases) -> None:
        super().__init__("activemq-jdbc", "ActiveMQ", script, bench_args)
        self.databases = databases
        self.database: str | None = None

    def _env(self) -> dict[str, str]:
        env = super()._env()
        server = self.databases.server
        database = self.database or "postgres"
        env["ACTIVEMQ_JDBC_URL"] = (
            f"jdbc:postgresql://127.0.0.1:{server.port}/{database}?user=sluice"
        )
        return env

    def start(self, data_dir: Path, cap: TaskCap) -> Running:
        self.database = self.databases.create()
        return super().start(data_dir, cap)

    def stop(self) -> None:
        super().stop()
        if self.database is not None:
            self.databases.drop(self.database)
            self.database = None


def make_pg_broker(name: str, databases: PgDatabases) -> SluicePostgresBroker | ActiveMQJdbcBroker:
    """One of `PG_BROKER_NAMES`, on `databases`."""
    bin_dir = Path(sys.executable).parent
    if name == "sluice-postgres":
        return SluicePostgresBroker(bin_dir / "sluice", Path(sys.executable), databases)
    if name == "activemq-jdbc":
        script = REPO / "benchmarks" / "peers" / "activemq.sh"
        return ActiveMQJdbcBroker(script, ["--login", "guest", "--passcode", "guest"], databases)
    raise ValueError(f"unknown broker {name}; known: {', '.join(PG_BROKER_NAMES)}")
