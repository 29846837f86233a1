"""Reading the PostgreSQL store back: pages of a destination by keyset, merged with the store's
overlay (what is queued and not yet committed), and the first sequence of a destination.

A page reads row metadata first (`dest_id = $1 AND seq > $2 ORDER BY seq LIMIT n`, on the
primary key's `(dest_id, seq)` index), picks what fits the byte budget, then reads those rows'
headers and bodies by id, and the chunks of the large ones. Queued adds come from the overlay with
their message, or by their row once written. A row deleted between the two queries (a remove the
writer committed meanwhile) is left out of the page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from sluice.errors import StoreError
from sluice.store.api import StoredMessage
from sluice.store.postgres.batch import Op
from sluice.store.postgres.schema import decode_headers

MAX_SEQ = (1 << 63) - 1
# Rows whose sizes a page reads per query while it fills its budget.
META_ROWS = 512


@dataclass(eq=False)
class Shown:
    """An add shown before it is committed: its message until written, then its row."""

    seq: int
    row_id: int
    size: int
    timestamp_ms: int
    op: Op


@dataclass
class Snapshot:
    """The overlay of one destination at one moment: adds shown (ascending), sequences hidden,
    and the floor at or below which committed rows are hidden."""

    shown: list[Shown]
    removed: set[int]
    floor: int


def read_page(
    conn: psycopg.Connection[Any],
    destination: str,
    snap: Snapshot,
    after_seq: int,
    max_count: int,
    max_bytes: int,
) -> list[StoredMessage]:
    """Messages after `after_seq`, ascending, at most `max_count` and within `max_bytes` (at
    least one)."""
    shown, removed = snap.shown, snap.removed
    picked: list[tuple[int, int, Shown | None]] = []  # (seq, row id, overlay entry)
    total = 0
    ov = 0
    cursor_seq = max(after_seq, snap.floor)
    done = cursor_seq >= MAX_SEQ
    rows: list[tuple[int, int, int]] = []
    ri = 0
    while len(picked) < max_count:
        if ri == len(rows) and not done:
            rows = conn.execute(
                "SELECT seq, size, id FROM messages WHERE dest_id = "
                "(SELECT id FROM destinations WHERE name = %s) AND seq > %s "
                "ORDER BY seq LIMIT %s",
                (destination, cursor_seq, META_ROWS),
            ).fetchall()
            ri = 0
            done = len(rows) < META_ROWS
            if rows:
                cursor_seq = rows[-1][0]
        next_db = rows[ri] if ri < len(rows) else None
        next_ov = shown[ov] if ov < len(shown) else None
        if next_db is None and next_ov is None:
            break
        entry: Shown | None = None
        if next_ov is not None and (next_db is None or next_ov.seq <= next_db[0]):
            ov += 1
            if next_db is not None and next_db[0] == next_ov.seq:
                ri += 1
            seq, size, row_id, entry = next_ov.seq, next_ov.size, next_ov.row_id, next_ov
        else:
            assert next_db is not None
            ri += 1
            seq, size, row_id = next_db
        if seq in removed:
            continue
        if picked and total + size > max_bytes:
            break
        picked.append((seq, row_id, entry))
        total += size
    if not picked:
        return []
    return _read_messages(conn, destination, picked)


def _read_messages(
    conn: psycopg.Connection[Any],
    destination: str,
    picked: list[tuple[int, int, Shown | None]],
) -> list[StoredMessage]:
    held: dict[int, StoredMessage] = {}
    fetch: list[int] = []
    for _seq, row_id, entry in picked:
        # Read once: the writer drops it only after the row is committed.
        message = entry.op.message if entry is not None else None
        if message is not None:
            held[row_id] = message
        else:
            fetch.append(row_id)
    rows: dict[int, tuple[Any, ...]] = {}
    chunked: list[int] = []
    if fetch:
        for row in conn.execute(
            "SELECT id, message_id, timestamp_ms, expires_ms, priority, persistent, "
            "headers, body, chunks FROM messages WHERE id = ANY(%s)",
            (fetch,),
        ):
            rows[row[0]] = row
            if row[8]:
                chunked.append(row[0])
    bodies: dict[int, list[bytes]] = {}
    if chunked:
        for row_id, data in conn.execute(
            "SELECT message, data FROM message_chunks WHERE message = ANY(%s) ORDER BY message, n",
            (chunked,),
        ):
            bodies.setdefault(row_id, []).append(data)
    out: list[StoredMessage] = []
    for seq, row_id, _entry in picked:
        message = held.get(row_id)
        if message is not None:
            out.append(_copy(message, seq))
            continue
        row = rows.get(row_id)
        if row is None:
            continue  # removed since the page was picked
        _, message_id, ts, expires, priority, persistent, headers, body, chunks = row
        if chunks:
            parts = bodies.get(row_id, [])
            if len(parts) != chunks:
                raise StoreError(
                    f"message {seq} of {destination}: {len(parts)} of {chunks} chunks stored"
                )
            body = b"".join(parts)
        out.append(
            StoredMessage(
                destination,
                seq,
                message_id,
                ts,
                decode_headers(headers, f"message {seq} of {destination}"),
                bytes(body),
                expires_ms=expires,
                priority=priority,
                persistent=persistent,
            )
        )
    return out


def first_seq(
    conn: psycopg.Connection[Any], destination: str, snap: Snapshot, at_or_after_ms: int
) -> int:
    """The lowest sequence stored (stamped at or after `at_or_after_ms`), 0 if none."""
    best = 0
    for entry in snap.shown:
        if entry.seq not in snap.removed and entry.timestamp_ms >= at_or_after_ms:
            best = entry.seq
            break
    row = conn.execute(
        "SELECT seq FROM messages WHERE dest_id = "
        "(SELECT id FROM destinations WHERE name = %s) AND seq > %s "
        "AND timestamp_ms >= %s AND seq <> ALL(%s::bigint[]) AND (%s = 0 OR seq < %s) "
        "ORDER BY seq LIMIT 1",
        (destination, snap.floor, at_or_after_ms, sorted(snap.removed), best, best),
    ).fetchone()
    return int(row[0]) if row is not None else best


def _copy(message: StoredMessage, seq: int) -> StoredMessage:
    """A stored message as a read hands it out: its own object, as one read from the database."""
    return StoredMessage(
        message.destination,
        seq,
        message.message_id,
        message.timestamp_ms,
        dict(message.headers),
        message.body,
        expires_ms=message.expires_ms,
        priority=message.priority,
        persistent=message.persistent,
    )
