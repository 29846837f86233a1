"""Opening the PostgreSQL store: migrate the schema, drop what unfinished transactions added,
trim the dedup windows, and read back what the core needs (destinations, counts, marks, dedup
ids, subscriptions) and what the writer needs (row ids and positions to go on from).

Nothing is replayed: the database committed exactly what the writer's transactions committed.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import psycopg

from sluice.store.api import RecoveredDestination, RecoveredSubscription, Recovery
from sluice.store.postgres.batch import WriterState
from sluice.store.postgres.schema import migrate


def recover(
    conn: psycopg.Connection[Any], schema: str, dedup_window: int
) -> tuple[Recovery, WriterState, int]:
    """(what is stored, the writer's state, the highest message row id) in the connection's
    transaction; the caller commits."""
    report = migrate(conn, schema)
    row = conn.execute(
        "WITH gone AS (DELETE FROM messages WHERE txno IS NOT NULL RETURNING id, chunks), "
        "chunks AS (DELETE FROM message_chunks "
        "WHERE message = ANY(ARRAY(SELECT id FROM gone WHERE chunks > 0))) "
        "SELECT count(*) FROM gone"
    ).fetchone()
    dropped = int(row[0]) if row is not None else 0
    if dropped:
        report.append(f"postgres: {dropped} messages of unfinished transactions dropped")
    state, destinations = read_state(conn, dedup_window)
    (max_row,) = conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone() or (0,)
    subscriptions = [
        RecoveredSubscription(client_id, name, destination, selector, int(cursor))
        for client_id, name, destination, selector, cursor in conn.execute(
            "SELECT client_id, name, destination, selector, cursor FROM subscriptions"
        )
    ]
    return Recovery(destinations, subscriptions, report), state, int(max_row)


def read_state(
    conn: psycopg.Connection[Any], dedup_window: int
) -> tuple[WriterState, list[RecoveredDestination]]:
    """The writer's state as the database holds it (at open, and again after the writer lost
    its connection with a batch that did not commit), and the live destinations."""
    rows = conn.execute(
        "SELECT id, name, live, last_seq, dispatch_mark FROM destinations"
    ).fetchall()
    # A destination's last sequence is its highest row's, or the one written when rows went.
    counts = {
        dest_id: (count, size, top)
        for dest_id, count, size, top in conn.execute(
            "SELECT dest_id, count(*), coalesce(sum(size), 0), max(seq) FROM messages "
            "WHERE seq IS NOT NULL GROUP BY dest_id"
        )
    }
    (max_pos,) = conn.execute("SELECT coalesce(max(pos), 0) FROM dedup_ids").fetchone() or (0,)
    (batch,) = conn.execute("SELECT batch FROM writer_batch").fetchone() or (0,)
    state = WriterState(
        dest_ids={},
        live=set(),
        last_seq={},
        next_dest_id=max((int(r[0]) for r in rows), default=0) + 1,
        next_dedup_pos=int(max_pos) + 1,
        dedup_pos={},
        dedup_window=dedup_window,
        batch=int(batch),
    )
    destinations = []
    for dest_id, name, live, written_seq, mark in rows:
        state.dest_ids[name] = dest_id
        if not live:
            continue
        state.live.add(name)
        count, size, top = counts.get(dest_id, (0, 0, 0))
        last_seq = max(int(written_seq), int(top))
        state.last_seq[name] = last_seq
        window = _dedup_window(conn, dest_id, dedup_window)
        state.dedup_pos[name] = deque(pos for pos, _ in window)
        destinations.append(
            RecoveredDestination(
                name=name,
                last_seq=int(last_seq),
                message_count=int(count),
                message_bytes=int(size),
                dispatch_mark=int(mark),
                dedup_ids=[dedup_id for _, dedup_id in window],
            )
        )
    return state, destinations


def _dedup_window(
    conn: psycopg.Connection[Any], dest_id: int, window: int
) -> list[tuple[int, str]]:
    """The newest ids of a destination's window, oldest first; older rows are deleted."""
    if window <= 0:
        conn.execute("DELETE FROM dedup_ids WHERE dest_id = %s", (dest_id,))
        return []
    newest = conn.execute(
        "SELECT pos, dedup_id FROM dedup_ids WHERE dest_id = %s ORDER BY pos DESC LIMIT %s",
        (dest_id, window),
    ).fetchall()
    if newest:
        conn.execute(
            "DELETE FROM dedup_ids WHERE dest_id = %s AND pos < %s", (dest_id, newest[-1][0])
        )
    return [(int(pos), str(dedup_id)) for pos, dedup_id in reversed(newest)]
