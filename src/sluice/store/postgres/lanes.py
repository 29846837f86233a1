"""The PostgreSQL writer's connections: a `Lane` is one connection, on which its thread runs
one batch at a time (its statements and its COMMIT, in pipeline mode: one round trip), and a
`Flight` is one batch from the moment it is built until it is completed.

Everything else (which lane builds the next batch, the order of the batches, their completions,
what is done about a failure) is the writer's (`writer.py`). A lane's connection is replaced
only while nothing runs on it.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from sluice.store.api import WriteHandle

if TYPE_CHECKING:
    from sluice.store.postgres.writer import Op


class Runnable(Protocol):
    """A batch's statements (`writer._Statements`)."""

    def run(self, cur: psycopg.Cursor[Any]) -> None:
        """Execute them on the cursor."""
        ...


@dataclass(eq=False)
class Flight:
    """One batch from the moment it is built until it is completed: its ops and what they turned
    into, the lane running it, and how that ended (`done`, `error`). `fatal`: the batch failed
    before it reached a lane (the store had failed, or the lease was lost)."""

    batch: list[Op]
    cursors: dict[tuple[str, str], int]
    handles: list[WriteHandle]
    statements: Runnable | None = None
    number: int = 0
    lazy: bool = False
    records: int = 0
    lane: Lane | None = None
    done: bool = False
    error: BaseException | None = None
    fatal: bool = False


class Lane:
    """One committer connection and the thread that uses it (the writer's `_lane_loop`).
    `cond` (on the writer's lock) wakes the thread; `waiting` says it sleeps on it."""

    def __init__(
        self, index: int, conn: psycopg.Connection[Any] | None, lock: threading.Lock
    ) -> None:
        self.index = index
        self.conn = conn
        self.cond = threading.Condition(lock)
        self.waiting = False
        # The flight whose statements run on the connection now.
        self.job: Flight | None = None
        # The pipeline mode of `_piped` (left and entered again with a new connection).
        self._pipeline = contextlib.ExitStack()
        self._piped: psycopg.Connection[Any] | None = None
        self.thread: threading.Thread | None = None

    def cancel(self) -> None:
        """Ask the server to cancel the statement under way (a batch waiting on the chain for
        a batch that will not commit). Harmless when nothing runs."""
        conn = self.conn
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                conn.cancel_safe(timeout=2.0)

    def replace(self, conn: psycopg.Connection[Any] | None) -> None:
        """Close the connection and take `conn` instead. Only while nothing runs on it."""
        assert self.job is None
        old, self.conn = self.conn, conn
        if old is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                self._pipeline.close()
            self._piped = None
            with contextlib.suppress(psycopg.Error, OSError):
                old.close()

    def close(self) -> None:
        """Leave pipeline mode and close the connection (the thread has ended)."""
        with contextlib.suppress(psycopg.Error, OSError):
            self._pipeline.close()
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def backend_pid(self) -> int:
        """The server process of the connection (0 when there is none)."""
        conn = self.conn
        return 0 if conn is None else int(conn.info.backend_pid)

    def commit(self, flight: Flight) -> BaseException | None:
        """Run the flight's statements and COMMIT: None, or what failed (the transaction is
        then rolled back)."""
        conn = self.conn
        statements = flight.statements
        assert conn is not None
        assert statements is not None
        try:
            if self._piped is not conn:
                # Pipeline mode for the connection's life: leaving it after each batch would
                # cost a round trip.
                self._pipeline.enter_context(conn.pipeline())
                self._piped = conn
            # One round trip for the whole batch and its COMMIT: the commit sends everything
            # and waits for the results.
            with conn.cursor() as cur:
                statements.run(cur)
            conn.commit()
        except (psycopg.Error, OSError) as exc:
            # A connection that is gone had its transaction rolled back by the server.
            with contextlib.suppress(psycopg.Error, OSError):
                conn.rollback()
            return exc
        return None
