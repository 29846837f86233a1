"""`PgLease`: the lease on a PostgreSQL store, held in one row of the database.

The row (`<schema>.ha_lease`, made by `ensure_schema`) holds the lease's holder, its epoch, how
many times it was renewed, whether it was released, and when it expires. Every time in it comes
from the database's clock (`clock_timestamp()`), never a broker's, so brokers whose clocks
disagree still agree on when a lease expired.

- Taking it: one `UPDATE ... WHERE released OR expires_at < clock_timestamp()` that raises the
  epoch by one, so two brokers can never both take it. A waiting broker tries every
  `lease_s / 3`.
- Holding it: the master renews every `lease_s / 3` with an `UPDATE` that matches its holder and
  epoch only. No row matched means another broker has it: lost. A renewal that fails (the
  connection is gone, the server restarts, the statement times out) is tried again on a new
  connection; the master's fence (`check`) holds only until `FENCE_FRACTION` of the lease time
  after its last successful renewal was sent, so a lost database is a lost lease within that
  time, never a hang. Every connection has a connect timeout, a statement timeout and TCP
  keepalives for that reason.
- The fence in the database: the store runs `fence_statement()` first in every write
  transaction. It locks the lease row for share and raises unless the row still names this
  holder and epoch and has not expired, so a master that lost its lease cannot commit anything,
  even one frozen (SIGSTOP) and resumed with a batch already sent: a takeover's `UPDATE` and a
  batch's fence exclude each other on the row, and whichever comes second sees the other's
  outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from sluice.errors import FencedError
from sluice.ha.lease import FENCE_FRACTION, RENEWALS_PER_LEASE, HeldLease

if TYPE_CHECKING:
    from sluice.ha.lease import Lease

__all__ = ["FENCE_MESSAGE", "PgLease", "ensure_schema"]

log = logging.getLogger(__name__)

# The error the fence raises in the database, and how the store recognizes it.
FENCE_MESSAGE = "sluice: this broker does not hold the lease"
# A waiting broker tries this often at most.
MAX_POLL_S = 0.25
_TABLE = "ha_lease"
_FENCE_FUNCTION = "ha_fence"


def _connect_options(lease_s: float) -> dict[str, Any]:
    """Timeouts that turn a lost database into an error within a fraction of the lease."""
    timeout_ms = max(100, int(lease_s * 1000 / RENEWALS_PER_LEASE))
    return {
        "autocommit": True,
        "connect_timeout": max(1, int(lease_s / RENEWALS_PER_LEASE)),
        "options": f"-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms}",
        "keepalives": 1,
        "keepalives_idle": 1,
        "keepalives_interval": 1,
        "keepalives_count": 3,
    }


def ensure_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """Create the lease table and the fence function in `schema` if they are missing."""
    ident = sql.Identifier(schema)
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.{} ("
            " name text PRIMARY KEY,"
            " holder text NOT NULL,"
            " epoch bigint NOT NULL,"
            " renewals bigint NOT NULL,"
            " released boolean NOT NULL,"
            " expires_at timestamptz NOT NULL,"
            " host text NOT NULL DEFAULT '',"
            " pid integer NOT NULL DEFAULT 0)"
        ).format(ident, sql.Identifier(_TABLE))
    )
    conn.execute(
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {schema}.{function}(p_name text, p_holder text, "
            "p_epoch bigint) RETURNS void LANGUAGE plpgsql AS $fence$ BEGIN "
            "PERFORM 1 FROM {schema}.{table} WHERE name = p_name AND holder = p_holder "
            "AND epoch = p_epoch AND NOT released AND expires_at > clock_timestamp() FOR SHARE; "
            "IF NOT FOUND THEN RAISE EXCEPTION {message}; END IF; END $fence$"
        ).format(
            schema=ident,
            function=sql.Identifier(_FENCE_FUNCTION),
            table=sql.Identifier(_TABLE),
            message=sql.Literal(FENCE_MESSAGE),
        )
    )


class PgLease(HeldLease):
    """The lease named `name` in `schema` of the database at `url`, valid `lease_s` unrenewed.
    `on_lost(reason)` is called once, from whichever thread finds the lease lost (the broker
    exits there)."""

    def __init__(
        self,
        url: str,
        lease_s: float,
        *,
        schema: str = "sluice",
        name: str = "broker",
        on_lost: Callable[[str], None] | None = None,
        holder: str | None = None,
    ) -> None:
        super().__init__(lease_s, on_lost=on_lost, holder=holder)
        self.url = url
        self.schema = schema
        self.name = name
        self._conn: psycopg.Connection[Any] | None = None
        table = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(_TABLE))
        self._insert = sql.SQL(
            "INSERT INTO {} (name, holder, epoch, renewals, released, expires_at) "
            "VALUES (%s, '', 0, 0, true, '-infinity') ON CONFLICT (name) DO NOTHING"
        ).format(table)
        self._take_sql = sql.SQL(
            "UPDATE {} SET holder = %s, epoch = epoch + 1, renewals = 0, released = false, "
            "expires_at = clock_timestamp() + make_interval(secs => %s), host = %s, pid = %s "
            "WHERE name = %s AND (released OR expires_at < clock_timestamp()) RETURNING epoch"
        ).format(table)
        self._renew_sql = sql.SQL(
            "UPDATE {} SET renewals = renewals + 1, "
            "expires_at = clock_timestamp() + make_interval(secs => %s) "
            "WHERE name = %s AND holder = %s AND epoch = %s AND NOT released RETURNING epoch"
        ).format(table)
        self._release_sql = sql.SQL(
            "UPDATE {} SET released = true WHERE name = %s AND holder = %s AND epoch = %s"
        ).format(table)
        self._end_stalled_sql = sql.SQL(
            "SELECT pg_terminate_backend(l.pid) FROM pg_locks l "
            "JOIN pg_class c ON c.oid = l.relation "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = 'ha_lease' AND l.mode = 'RowShareLock' "
            "AND l.granted AND l.pid <> pg_backend_pid() "
            "AND EXISTS (SELECT 1 FROM {} WHERE name = %s AND expires_at < clock_timestamp())"
        ).format(table)
        self._show_sql = sql.SQL(
            "SELECT holder, epoch, expires_at - clock_timestamp() FROM {} WHERE name = %s"
        ).format(table)
        self._fence_text = (
            sql.SQL("SELECT {}.{}(%s, %s, %s)")
            .format(sql.Identifier(schema), sql.Identifier(_FENCE_FUNCTION))
            .as_string(None)
        )

    thread_name = "sluice-pg-lease"

    @property
    def where(self) -> str:
        """The lease as messages name it."""
        return self.name

    message = FENCE_MESSAGE

    # The database fences every write batch itself: a previous holder that wakes cannot commit.
    previous_may_be_alive = False

    def statement(self) -> tuple[str, tuple[str, str, int]]:
        """The statement (and its parameters) a write transaction runs first: it raises, and so
        rolls the transaction back, unless this process still holds the lease."""
        return self._fence_text, (self.name, self.holder, self._epoch)

    def lost(self, reason: str) -> None:
        """The database refused a write for want of the lease: it is lost (`on_lost`)."""
        self._lose(reason)

    # -- connections -----------------------------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, **_connect_options(self.lease_s))
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error as exc:
                log.debug("closing the lease's connection: %s", exc)

    # -- taking the lease ------------------------------------------------------------------------

    def acquire(self, stop: object | None = None, *, wait: bool = True) -> int | None:
        """Take the lease, waiting while another broker keeps it renewed (unless not `wait`).
        Returns the new epoch; None when `stop` (a `threading.Event`) is set while waiting, or
        without `wait` when another broker holds it. A database that cannot be reached is
        waited for like a held lease, and logged."""
        stop_event = stop if isinstance(stop, threading.Event) else threading.Event()
        poll_s = min(MAX_POLL_S, self.lease_s / RENEWALS_PER_LEASE)
        announced: tuple[str, int] | None = None
        while not stop_event.is_set():
            try:
                conn = self._connection()
                ensure_schema(conn, self.schema)
                conn.execute(self._insert, (self.name,))
                started = time.monotonic()
                row = conn.execute(
                    self._take_sql, (self.holder, self.lease_s, self.host, self.pid, self.name)
                ).fetchone()
                if row is not None:
                    self._epoch = int(row[0])
                    self._valid_until = started + self.lease_s * FENCE_FRACTION
                    log.info("took the lease %s at epoch %d", self.name, self._epoch)
                    return self._epoch
                shown = conn.execute(self._show_sql, (self.name,)).fetchone()
                if shown is not None and (shown[0], shown[1]) != announced:
                    announced = (str(shown[0]), int(shown[1]))
                    log.info(
                        "waiting for the lease %s, held by %s at epoch %d (expires in %s)",
                        self.name,
                        shown[0],
                        shown[1],
                        shown[2],
                    )
            except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
                # A batch of the holder's holds the row (its fence) and has not committed.
                self._end_stalled_batches()
            except psycopg.Error as exc:
                log.warning("cannot reach the lease's database (trying again): %s", exc)
                self._drop_connection()
            if not wait:
                return None
            stop_event.wait(poll_s)
        return None

    def _end_stalled_batches(self) -> None:
        """The takeover waited in vain for a batch of the holder, which locks the lease's row
        from its fence to its COMMIT: a holder frozen in between (SIGSTOP, a paused VM) would keep
        every broker out for as long as it is frozen. Once the lease has expired by the
        database's clock, that holder may no longer commit anything, so its sessions that hold
        the row are ended (their transactions roll back) and the next try takes the lease."""
        conn = self._connection()
        ended = conn.execute(self._end_stalled_sql, (self.schema, self.name)).fetchall()
        if ended:
            log.warning(
                "the lease %s has expired, but a batch of its holder kept it locked: ended %d "
                "session(s) of that holder (their uncommitted writes roll back)",
                self.name,
                len(ended),
            )
        else:
            log.info("the lease %s is locked by a write of its holder (trying again)", self.name)

    # -- holding it ------------------------------------------------------------------------------

    def _renew_round(self) -> None:
        try:
            self.renew()
        except psycopg.Error as exc:
            # Tried again next round on a new connection; the fence ends writes meanwhile.
            log.warning("renewing the lease %s failed: %s", self.name, exc)
            self._drop_connection()

    def renew(self) -> None:
        """Renew the lease in the database. Raises `FencedError` (after `on_lost`) when it is
        no longer this process's, `psycopg.Error` when the database could not say."""
        started = time.monotonic()
        row = (
            self._connection()
            .execute(self._renew_sql, (self.lease_s, self.name, self.holder, self._epoch))
            .fetchone()
        )
        if row is None:
            self._lose("the database shows another holder or epoch")
            raise FencedError(f"the lease {self.name} was taken over")
        self._renewed(started)

    def release(self) -> None:
        """Stop renewing, and mark the lease released (when still this process's) so that a
        waiting broker takes it at once."""
        self._stop_renewing()
        if self._epoch and self._lost is None:
            try:
                self._connection().execute(self._release_sql, (self.name, self.holder, self._epoch))
            except psycopg.Error as exc:
                log.warning("releasing the lease %s: %s", self.name, exc)
        self._valid_until = float("-inf")
        self._drop_connection()


def _is_lease(lease: PgLease) -> Lease:
    return lease  # mypy checks that PgLease offers what every lease offers
