"""What a simulated life needs to run against the PostgreSQL store: the server (a URL, and a way
to crash and restart it), a schema of its own per life, and the two faults a life injects.

Crashes of a PostgreSQL life (the `crash` event, on the event after it):
- plain: once the event's step is done, the store is dropped without `close()` (the broker
  process is gone; its connections close, the server rolls back what was not committed);
- `opt` torn bit: every writer connection is terminated by the server (`pg_terminate_backend`)
  while the step's batch waits for it: the writer connects again, finds the batch did not
  commit, reads its state back from the database and writes the batch again; then the store is
  dropped;
- `opt` power bit: after dropping the store, the server itself crashes (`pg_ctl -m immediate`)
  and restarts, recovering from its WAL: everything committed must still be there.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg import sql

_LIVES = itertools.count(1)


@dataclass(frozen=True)
class PgTarget:
    """The PostgreSQL server lives run against."""

    url: str
    # Crash the server (pg_ctl -m immediate) and start it again on the same port.
    restart: Callable[[], None]


def life_schema(seed: int) -> str:
    """A schema for one life of `seed`, unused by any other life of this process."""
    return f"life{seed}_{os.getpid()}_{next(_LIVES)}"


def terminate_backend(url: str, pid: int) -> None:
    """Have the server end one connection's backend (it rolls back that connection's open
    transaction), and wait until it is gone."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))


def drop_schema(url: str, schema: str) -> None:
    """Remove what a life left in the database."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
